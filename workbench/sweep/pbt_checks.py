"""What a `[sweep.scheduler]` with `kind = "pbt"` needs of the recipe, checked before launch.

The shape of the table (interval, quantile, factors...) is `PbtSpec`'s to check; here, what
it needs of the rest of the recipe:

- something to perturb: a `[sweep]` key a fork may change (`lora.rank` and `lora.alpha`
  come with the checkpoint, so a fork cannot change them); `perturb`, when given, names
  only such keys of `[sweep.grid]` or `[sweep.random]`;
- a judged step below `max_steps`, with a record of the metric at it: for an eval metric,
  `interval` a multiple of `eval.interval` (evals on);
- a checkpoint at every judged step to fork from: `checkpoint_interval` above 0 and a
  divisor of `interval`;
- enough runs to rank: `min_runs` at most the number of runs.

`perturbed_params` is also how the supervisor learns which keys to perturb.
"""

from __future__ import annotations

from typing import Any

from workbench.config import ConfigProblem, problem_at
from workbench.sweep.checks import Param
from workbench.sweep.spec import PbtSpec

# Set by the adapter's shape: a fork takes them with the checkpoint (`commands.fork`).
FIXED_BY_CHECKPOINT = ("lora.rank", "lora.alpha")
EVAL_PREFIX = "eval_"
SCHEDULER = ("sweep", "scheduler")


def perturbed_params(spec: PbtSpec, swept: list[Param]) -> dict[str, Param]:
    """The keys PBT perturbs, with their `[sweep]` values or distribution: `perturb`, or
    every swept key a fork may change."""
    by_key = {param.key: param for param in swept}
    keys = spec.perturb if spec.perturb is not None else list(by_key)
    return {key: by_key[key] for key in keys if key in by_key and key not in FIXED_BY_CHECKPOINT}


def pbt_problems(
    spec: PbtSpec,
    swept: list[Param],
    defaults: dict[str, Any] | None,
    runs: int,
    text: str | None,
) -> list[ConfigProblem]:
    """Every reason the recipe cannot run population-based training (module docstring)."""
    problems = _perturb_problems(spec, swept, text)
    if runs < spec.min_runs:
        problems.append(
            problem_at(
                (*SCHEDULER, "min_runs"),
                f"{spec.min_runs} runs must be ranked before any is judged, but the recipe "
                f"has {runs}: no run would ever take another's checkpoint; lower min_runs or "
                "add runs",
                text,
            )
        )
    if defaults is not None:
        problems += _step_problems(spec, defaults, text)
    return problems


def _perturb_problems(spec: PbtSpec, swept: list[Param], text: str | None) -> list[ConfigProblem]:
    keys = [param.key for param in swept]
    if spec.perturb is not None:
        problems = []
        for index, key in enumerate(spec.perturb):
            if key in FIXED_BY_CHECKPOINT:
                why = "comes with the checkpoint a run takes (the adapter's shape); a fork cannot change it"
            elif key not in keys:
                why = (
                    f"is not a key of [sweep.grid] or [sweep.random] ({', '.join(keys) or 'none'})"
                )
            else:
                continue
            problems.append(problem_at((*SCHEDULER, "perturb", index), f"{key!r} {why}", text))
        if problems or spec.perturb:
            return problems
    if perturbed_params(spec, swept):
        return []
    varied = ", ".join(keys) if keys else "nothing"
    return [
        problem_at(
            (*SCHEDULER, "perturb" if spec.perturb is not None else "kind"),
            f'"pbt" has nothing to perturb: [sweep] varies {varied}, and a fork cannot change '
            f"{' or '.join(FIXED_BY_CHECKPOINT)} (they come with the checkpoint); vary a setting "
            'a run can change mid-way, e.g. grid.lr = [1e-3, 3e-3], or use kind = "asha"',
            text,
        )
    ]


def _step_problems(
    spec: PbtSpec, defaults: dict[str, Any], text: str | None
) -> list[ConfigProblem]:
    problems = []
    max_steps = defaults.get("max_steps")
    if isinstance(max_steps, int) and not spec.judged_steps(max_steps):
        problems.append(
            problem_at(
                (*SCHEDULER, "interval"),
                f"{spec.interval} is not below [defaults] max_steps ({max_steps}): no run would "
                f"ever be judged; e.g. interval = {max(1, max_steps // 4)}",
                text,
            )
        )
    eval_interval = (defaults.get("eval") or {}).get("interval")
    if spec.metric.startswith(EVAL_PREFIX) and isinstance(eval_interval, int):
        if eval_interval == 0:
            problems.append(
                problem_at(
                    (*SCHEDULER, "metric"),
                    f"{spec.metric!r} is an eval metric, but [defaults.eval] interval = 0 turns "
                    "evals off; set it to a divisor of the scheduler's interval",
                    text,
                )
            )
        elif spec.interval % eval_interval:
            problems.append(
                problem_at(
                    (*SCHEDULER, "interval"),
                    f"{spec.interval} is not a multiple of [defaults.eval] interval "
                    f"({eval_interval}): runs are judged by {spec.metric!r} at the steps where "
                    f"they have a record of it; e.g. interval = {eval_interval * 2}",
                    text,
                )
            )
    checkpoints = defaults.get("checkpoint_interval")
    if isinstance(checkpoints, int) and (checkpoints == 0 or spec.interval % checkpoints):
        problems.append(
            problem_at(
                (*SCHEDULER, "interval"),
                f"a run takes another's checkpoint of step {spec.interval}, {2 * spec.interval}, "
                f"...; [defaults] checkpoint_interval = {checkpoints} does not write those: set "
                f"checkpoint_interval = {spec.interval} (or a divisor of it)",
                text,
            )
        )
    return problems
