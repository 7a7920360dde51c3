"""The seed control of `bench e2e --vs separate`: does a run whose curve split from its lone
twin still learn as it does alone?

Packed beside other runs, a run's tokens go through matmuls of other shapes than alone, so
its adapter differs from its twin's in the last bits. A run that learns steadily shrugs
that off (its curves stay within `CURVE_TOLERANCE`). A run near the edge of stability (the
built-in recipe above lr 8e-3) does not: one token sampled differently sends shared and
alone down different paths, and a later step's rewards can be further apart than the
tolerance. Any perturbation would split such a run; another seed is a far larger one. So
the curves alone cannot tell the shared trainer changing a run from a run that is chaotic.

What can: the run trained alone again under other seeds. Its outcome, the mean reward of
its last `OUTCOME_STEPS` steps, is compared with its outcomes alone: its twin's (same
seed) and those of `CONTROL_SEEDS` other seeds, each its own experiment. From these n
outcomes alone, a 95 % prediction interval for one more run alone (Student's t with n - 1
degrees of freedom: mean +- t * sd * sqrt(1 + 1/n)), never narrower than
`CURVE_TOLERANCE` on each side. The split run passes when its shared outcome lies inside:
it ends where the run ends alone. Outside, sharing changed how it learns (or, 1 time in
20, chance did: the benchmark can be run again).

The check is only as sharp as the run's own spread: for a run whose outcome alone moves
0.05 from seed to seed it cannot see a change of 0.05. The result says what the spread
was (`alone_mean`, `alone_sd`, `interval`).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from workbench.bench import separate_setup as separate
from workbench.bench.separate_setup import (
    CURVE_TOLERANCE,
    LEARNING_RATES,
    BenchRun,
    Experiment,
    run_id_for,
    write_experiment,
)

# Other seeds per split run: with its twin, 5 outcomes alone (6 with an at-once twin). A
# prediction interval from 3 would be +-5 sd wide (t = 4.30), from 5 +-3 sd.
CONTROL_SEEDS = 4
OUTCOME_STEPS = 5
# Student's t, two-sided 95 % (the 0.975 quantile), by degrees of freedom: the standard
# table's values, to 3 decimals.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}
SEED_MARK = "-seed"  # a control run's id: the split run's, this, the seed


def outcome(curve: list[list[Any]]) -> float | None:
    """The mean reward of a curve's last `OUTCOME_STEPS` steps (None without steps)."""
    rewards = [point[1] for point in curve[-OUTCOME_STEPS:]]
    return statistics.fmean(rewards) if rewards else None


def finished_outcome(curve: list[list[Any]], steps: int) -> float | None:
    """The outcome of a curve of `steps` steps; None for one cut short."""
    return outcome(curve) if len(curve) == steps else None


def control_seeds(run_seed: int, count: int = CONTROL_SEEDS) -> tuple[int, ...]:
    return tuple(run_seed + i for i in range(1, count + 1))


def control_run_id(run_id: str, seed: int) -> str:
    return f"{run_id}{SEED_MARK}{seed}"


def split_run_of(control_id: str) -> str:
    """The split run a control run trains alone: `lr8p5e-3` for `lr8p5e-3-seed1`."""
    return control_id.rsplit(SEED_MARK, 1)[0]


def write_controls(
    recipe: Path, split_runs: list[str], seeds: tuple[int, ...], slots: int, scratch: Path
) -> list[Experiment]:
    """One experiment of one run per split run and seed, with the benchmark's slots."""
    lr_of = {run_id_for(lr): lr for lr in LEARNING_RATES}
    return [
        write_experiment(
            recipe,
            f"{recipe.stem}_{control_run_id(run_id, seed)}",
            [BenchRun(control_run_id(run_id, seed), lr_of[run_id], seed)],
            slots,
            scratch / "seed_control" / control_run_id(run_id, seed),
        )
        for run_id in split_runs
        for seed in seeds
    ]


def prediction_interval(alone: list[float]) -> tuple[float, float]:
    """Where one more outcome alone falls 95 times in 100 (see the module docstring)."""
    n = len(alone)
    mean = statistics.fmean(alone)
    half = T_975[n - 1] * statistics.stdev(alone) * math.sqrt(1 + 1 / n)
    half = max(half, CURVE_TOLERANCE)
    return mean - half, mean + half


def judge(
    split_runs: list[str],
    setups: dict[str, dict[str, Any]],
    control: dict[str, Any],
    seeds: tuple[int, ...],
) -> dict[str, dict[str, Any]]:
    """Per split run: its outcome shared, alone (its twins by setup, the controls by seed),
    the prediction interval from those alone, and whether the shared one is inside. A curve
    alone with fewer steps than the shared one (an experiment that did not finish) has no
    outcome, and the run is then not judged inside."""
    verdicts = {}
    for run_id in split_runs:
        shared_curve = setups["shared"]["runs"][run_id]["curve"]
        steps = len(shared_curve)
        shared = outcome(shared_curve)
        twins = {
            name: finished_outcome(result["runs"][run_id]["curve"], steps)
            for name, result in setups.items()
            if name != "shared" and run_id in result.get("runs", {})
        }
        controls = {
            str(seed): finished_outcome(
                control.get("runs", {}).get(control_run_id(run_id, seed), {}).get("curve", []),
                steps,
            )
            for seed in seeds
        }
        alone = [value for value in (*twins.values(), *controls.values()) if value is not None]
        complete = (
            shared is not None
            and len(alone) == len(twins) + len(controls)
            and 2 <= len(alone) <= len(T_975) + 1
        )
        low, high = prediction_interval(alone) if complete else (None, None)
        verdicts[run_id] = {
            "shared": _rounded(shared),
            "twins": {name: _rounded(value) for name, value in twins.items()},
            "other_seeds": {seed: _rounded(value) for seed, value in controls.items()},
            "alone_mean": _rounded(statistics.fmean(alone)) if alone else None,
            "alone_sd": _rounded(statistics.stdev(alone)) if len(alone) > 1 else None,
            "interval": [_rounded(low), _rounded(high)],
            "within_spread": complete and low <= shared <= high,  # type: ignore[operator]
        }
    return verdicts


def run_seed_control(
    recipe: Path,
    split_runs: list[str],
    setups: dict[str, dict[str, Any]],
    *,
    run_seed: int,
    slots: int,
    scratch: Path,
    max_steps: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Train each split run alone under other seeds, one experiment after another, and
    judge it (see the module docstring)."""
    seeds = control_seeds(run_seed)
    experiments = write_controls(recipe, split_runs, seeds, slots, scratch)
    control = separate.run_setup(
        "seed_control", experiments, max_steps=max_steps, timeout_s=timeout_s
    )
    return {
        "outcome": f"mean reward of the last {OUTCOME_STEPS} steps",
        "seeds": list(seeds),
        "runs": judge(split_runs, setups, control, seeds),
        "curves": {run_id: run["curve"] for run_id, run in control["runs"].items()},
        "wall_s": control["wall_s"],
        "cpu_s": control["cpu_s"],
        "problems": control["problems"],
    }


def explained(curves: dict[str, Any]) -> bool:
    """Every split run (if any) ends inside its interval alone."""
    verdicts = (curves.get("seed_control") or {}).get("runs", {})
    return all(verdicts.get(run_id, {}).get("within_spread") for run_id in curves["split_runs"])


def describe(control: dict[str, Any]) -> str:
    """The seed control in a line: each split run's outcome shared against alone."""
    parts = []
    for run_id, verdict in control["runs"].items():
        low, high = verdict["interval"]
        alone = [*verdict["twins"].values(), *verdict["other_seeds"].values()]
        where = "inside" if verdict["within_spread"] else "OUTSIDE"
        parts.append(
            f"{run_id} ends at {verdict['shared']} shared, alone at "
            f"{', '.join(map(str, alone))} (its twin; seeds "
            f"{', '.join(map(str, control['seeds']))}): {where} the 95 % interval "
            f"{low} to {high}"
        )
    return "; ".join(parts)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
