"""Expanding a recipe's `[sweep]` table into runs, and checking it first.

Pure functions: the recipe loader (`workbench.recipe.recipe_from_document`) calls
`plan_sweep`, which reports every problem of the table at once (file, line and key, like
every recipe error) or returns the runs; the loaded recipe keeps them
(`Recipe.planned_runs`). `expand_sweep` is the expansion alone, of a table already
accepted.

Expansion order (also the order in which runs get trainer slots):

    for repeat r in 0..repeats-1:           # every configuration once before any twice
        for sample i in 0..num_samples-1:   # draw i of [sweep.random]
            for each grid combination:      # itertools.product, the last key fastest
                one run

A random draw depends only on (seed, sample index, key): sample i has the same values at
every grid point and repeat, and adding a key leaves the other keys' draws unchanged.
Repeat r sets `seed` to the configuration's seed + r. Drawn floats are rounded to three
significant figures, so ids and configs show the same numbers.

Run ids: `ids = "values"` names a run by what it varies (`run_lr3e-3_rank8`, and
`_seed1` for repeats); `"index"` numbers them (`run_sweep07`); `"auto"` (the default)
uses values when every id is readable, unique and short, else the index.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from workbench.config import ConfigProblem, explain_error, problem_at
from workbench.sweep.checks import (
    Param,
    config_problems,
    count_runs,
    rank_problems,
    read_params,
    rule_problems,
)
from workbench.sweep.ids import SIGNIFICANT_DIGITS, index_ids, value_ids
from workbench.sweep.pbt_checks import pbt_problems
from workbench.sweep.spec import (
    SCHEDULER_MODELS,
    IntRange,
    LogUniform,
    PbtSpec,
    SweepSection,
    Uniform,
)
from workbench.sweep.values import nested


@dataclass(frozen=True)
class PlannedRun:
    """One run of a recipe: its id and the values it sets over `[defaults]`.

    `values` maps dotted keys (`lora.rank`) to values; `source` is "runs" for a
    `[[runs]]` table and "sweep" for a run the sweep expanded to.
    """

    run_id: str
    values: dict[str, Any]
    source: str = "sweep"

    @property
    def overrides(self) -> dict[str, Any]:
        """The values as nested tables, ready to deep-merge into `[defaults]`."""
        return nested(self.values)


# ---------------------------------------------------------------- the recipe loader's entry


def plan_sweep(
    raw: Any,
    defaults: dict[str, Any] | None,
    taken_ids: dict[str, int],
    text: str | None,
    trainer_rank: int | None = None,
) -> tuple[SweepSection | None, list[PlannedRun], list[ConfigProblem]]:
    """Check a raw `[sweep]` table and expand it.

    `defaults` is the recipe's full `[defaults]` (None when they are invalid themselves:
    then the swept values are not checked, to avoid a second report of the same fault);
    `taken_ids` are the `[[runs]]` ids (full id -> index); `trainer_rank` the rank of the
    trainer's adapter slots, the most a run may ask for. Returns the section, the runs and
    the problems; the runs are empty whenever there is a problem.
    """
    if not isinstance(raw, dict):
        return None, [], [problem_at(("sweep",), "must be a table: write [sweep]", text)]
    section: SweepSection | None = None
    problems: list[ConfigProblem] = []
    try:
        section = SweepSection.model_validate(raw)
    except ValidationError as err:
        for item in err.errors():
            loc, message = _explained(item)
            problems.append(problem_at(("sweep", *loc), message, text))
    # The swept keys are checked even when another key of [sweep] is wrong: every
    # problem is reported at once.
    grid, sampled, param_problems = read_params(raw, defaults, text)
    problems += param_problems + rank_problems(grid + sampled, trainer_rank, text)
    if section is None or problems:  # the rules below count and compare values
        return section, [], problems
    problems += rule_problems(section, grid, sampled, text)
    if isinstance(section.scheduler, PbtSpec):
        runs = len(taken_ids) + count_runs(section, grid, sampled)
        problems += pbt_problems(section.scheduler, grid + sampled, defaults, runs, text)
    if problems:
        return section, [], problems
    runs = _expand(section, grid, sampled, _seed_of(defaults))
    if defaults is not None:
        problems += config_problems([run.values for run in runs], grid + sampled, defaults, text)
    if problems:
        return section, [], problems
    return _name_runs(section, runs, [p.key for p in grid + sampled], taken_ids, text)


def expand_sweep(section: SweepSection, defaults: dict[str, Any]) -> list[PlannedRun]:
    """The runs of a sweep that `plan_sweep` accepted, in expansion order."""
    _, runs, problems = plan_sweep(section.model_dump(mode="json"), defaults, {}, None)
    if problems:
        raise ValueError("; ".join(p.render(None) for p in problems))
    return runs


def _explained(item: Any) -> tuple[tuple, str]:
    """An error's key in [sweep] and its message. pydantic puts the scheduler's kind in the
    location of its errors (`scheduler.pbt.interval`), which the recipe has no key for;
    they are explained against that kind's model."""
    loc = tuple(item["loc"])
    if len(loc) > 1 and loc[0] == "scheduler" and loc[1] in SCHEDULER_MODELS:
        inner = loc[2:]
        model = SCHEDULER_MODELS[loc[1]]
        return (loc[0], *inner), explain_error({**item, "loc": inner}, model, inner)
    return loc, explain_error(item, SweepSection, loc)


# ---------------------------------------------------------------- expansion


def _expand(
    section: SweepSection, grid: list[Param], sampled: list[Param], seed: int
) -> list[PlannedRun]:
    if count_runs(section, grid, sampled) == 0:
        return []
    samples = (section.num_samples or 1) if sampled else 1
    runs = []
    for repeat in range(section.repeats):
        for sample in range(samples):
            drawn = {param.key: draw_value(param, section.seed, sample) for param in sampled}
            for combination in itertools.product(*(param.values for param in grid)):
                values = {
                    param.key: copy.deepcopy(v) for param, v in zip(grid, combination, strict=True)
                }
                values.update(copy.deepcopy(drawn))
                if section.repeats > 1:
                    values["seed"] = seed + repeat
                runs.append(PlannedRun(run_id="", values=values))
    return runs


def draw_value(param: Param, seed: int | float | str, sample: int) -> Any:
    """One draw of a [sweep.random] key; the same (seed, sample, key) draws the same."""
    # A string seed is hashed with SHA-512: the same draw on every machine and Python.
    rng = random.Random(f"{seed}/{sample}/{param.key}")
    distribution = param.distribution
    if isinstance(distribution, IntRange):
        return rng.randint(distribution.low, distribution.high)
    if isinstance(distribution, Uniform):
        value = rng.uniform(distribution.low, distribution.high)
    elif isinstance(distribution, LogUniform):
        value = math.exp(rng.uniform(math.log(distribution.low), math.log(distribution.high)))
    else:
        assert distribution is not None
        return copy.deepcopy(rng.choice(distribution.values))
    rounded = float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    return min(max(rounded, distribution.low), distribution.high)


def _seed_of(defaults: dict[str, Any] | None) -> int:
    seed = (defaults or {}).get("seed", 0)
    return seed if isinstance(seed, int) else 0


def _name_runs(
    section: SweepSection,
    runs: list[PlannedRun],
    keys: list[str],
    taken_ids: dict[str, int],
    text: str | None,
) -> tuple[SweepSection, list[PlannedRun], list[ConfigProblem]]:
    if runs and "seed" in runs[0].values and "seed" not in keys:
        keys = [*keys, "seed"]  # repeats
    readable, why_not = value_ids([run.values for run in runs], keys)
    if section.ids == "values" and readable is None:
        message = f'"values" cannot name these runs: {why_not}; use ids = "index" or "auto"'
        return section, [], [problem_at(("sweep", "ids"), message, text)]
    ids = readable if section.ids != "index" and readable is not None else index_ids(len(runs))
    problems = [
        problem_at(
            ("runs", taken_ids[run_id], "id"),
            f"the sweep also makes a run {run_id!r}; give this run another id",
            text,
        )
        for run_id in ids
        if run_id in taken_ids
    ]
    if problems:
        return section, [], problems
    named = [PlannedRun(run_id, run.values) for run_id, run in zip(ids, runs, strict=True)]
    return section, named, []
