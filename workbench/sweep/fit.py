"""A sigmoid fit of a run's eval reward against its training compute (ScaleRL's curve, as
RALO uses it), so runs can be ranked by where they are heading rather than where they are.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)

R0 is the reward before training (the eval of policy version 0), A the asymptote the run
approaches, C_mid the compute at which it has made half of its gain, B the slope (how sharp
the rise is around C_mid). Compute C is the run's policy version, i.e. its trainer steps:
within one sweep every run trains the same number of samples per step, so steps are
proportional to samples (token counts differ by the completions' lengths only).

The fit is a pure least-squares search, numpy only: for fixed (C_mid, B) the curve is
linear in A, so A has a closed form; (C_mid, B) are searched on a log grid and refined
around the best point. It is deterministic.

When it is reliable (`SigmoidFit.reliable`): the curve must have bent, i.e. the run's last
eval is at or past the fitted C_mid, and at least `MIN_POINTS` evals after version 0 back
three parameters. Before the midpoint the asymptote is an extrapolation of the early rise,
and A, C_mid trade off against each other (a higher A further away fits as well). Runs that
rise then fall (a learning rate too high) fit poorly; their `rmse` says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

MIN_POINTS = 4  # evals after version 0: more than the three fitted parameters
SLOPES = np.geomspace(0.25, 8.0, 25)
GRID = 60  # midpoints tried, log-spaced over the observed compute range widened
REFINE_ROUNDS = 3


@dataclass(frozen=True)
class SigmoidFit:
    asymptote: float  # A
    midpoint: float  # C_mid, in steps
    slope: float  # B
    start: float  # R0
    rmse: float
    points: int  # evals after version 0 that were fitted
    reliable: bool
    note: str | None = None  # why it is not reliable

    def predict(self, compute: float) -> float:
        return self.start + (self.asymptote - self.start) * _rise(
            compute, self.midpoint, self.slope
        )

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _rise(compute: Any, midpoint: float, slope: float) -> Any:
    """1 / (1 + (C_mid / C)^B): 0 at C = 0, one half at C_mid, towards 1 beyond."""
    c = np.asarray(compute, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(c > 0, 1.0 / (1.0 + (midpoint / np.maximum(c, 1e-300)) ** slope), 0.0)


def fit_sigmoid(curve: Sequence[tuple[int, float]]) -> SigmoidFit | None:
    """Fit (step, eval reward) points, version 0 included; None without a version-0 eval or
    without any later one."""
    start = next((value for step, value in curve if step == 0), None)
    later = [(float(step), float(value)) for step, value in curve if step > 0]
    if start is None or not later:
        return None
    compute = np.array([c for c, _ in later])
    rewards = np.array([r for _, r in later]) - start
    # Midpoints from a quarter of the first eval's compute to 20x the last: beyond that
    # the data say nothing about C_mid. Each refinement narrows the grid around the best.
    low, high = math.log(compute.min() / 4), math.log(compute.max() * 20)
    log_m, log_b = np.linspace(low, high, GRID), np.log(SLOPES)
    best = _search(compute, rewards, np.exp(log_m), SLOPES)
    for _ in range(REFINE_ROUNDS):
        _, _, midpoint, slope = best
        width_m, width_b = log_m[1] - log_m[0], log_b[1] - log_b[0]
        log_m = np.linspace(math.log(midpoint) - width_m, math.log(midpoint) + width_m, 21)
        log_b = np.linspace(math.log(slope) - width_b, math.log(slope) + width_b, 21)
        log_m, log_b = log_m.clip(low, high), log_b.clip(math.log(SLOPES[0]), math.log(SLOPES[-1]))
        best = _search(compute, rewards, np.exp(log_m), np.exp(log_b))
    sse, gain, midpoint, slope = best
    points = len(later)
    note = None
    if points < MIN_POINTS:
        note = f"{points} evals after version 0; a fit needs {MIN_POINTS}"
    elif compute.max() < midpoint:
        note = f"not past its midpoint yet (step {compute.max():g} < {midpoint:.3g})"
    return SigmoidFit(
        asymptote=start + gain,
        midpoint=midpoint,
        slope=float(slope),
        start=start,
        rmse=math.sqrt(sse / points),
        points=points,
        reliable=note is None,
        note=note,
    )


def _search(
    compute: np.ndarray, rewards: np.ndarray, midpoints: np.ndarray, slopes: np.ndarray
) -> tuple[float, float, float, float]:
    """(sse, A - R0, C_mid, B) of the least-squares best over the grid."""
    best = (math.inf, 0.0, float(midpoints[0]), float(slopes[0]))
    for slope in slopes:
        rise = _rise(compute[None, :], midpoints[:, None], slope)  # midpoints x points
        norms = (rise * rise).sum(axis=1)
        gains = np.where(norms > 0, (rise * rewards).sum(axis=1) / np.maximum(norms, 1e-300), 0)
        errors = ((gains[:, None] * rise - rewards) ** 2).sum(axis=1)
        index = int(np.argmin(errors))
        if errors[index] < best[0]:
            best = (float(errors[index]), float(gains[index]), float(midpoints[index]), slope)
    return best[0], best[1], best[2], float(best[3])
