"""Expanding a recipe's `[sweep]` table into runs, and checking it first.

Pure functions: the recipe loader (`workbench.config.recipe_from_document`) calls
`plan_sweep`, which reports every problem of the table at once (file, line and key, like
every recipe error) or returns the runs. `expand_sweep` is the expansion alone, for
whoever holds a valid `Recipe`; `planned_runs` lists every run of a recipe in the order
the trainer admits them.

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
import difflib
import itertools
import json
import math
import random
import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from workbench import layout
from workbench.config import (
    ConfigProblem,
    OrchestratorConfig,
    Recipe,
    explain_error,
    nest_dotted,
    normalize_run_id,
    problem_at,
)
from workbench.sweep.spec import (
    DISTRIBUTIONS,
    Distribution,
    IntRange,
    LogUniform,
    SweepSection,
    Uniform,
    bounds_of,
)

INDEX_PREFIX = "sweep"
MAX_READABLE_ID = 64
# Runs whose expanded config fails a check are listed up to this many; the rest are counted.
MAX_LISTED_FAILURES = 5
SIGNIFICANT_DIGITS = 3

Loc = tuple[str | int, ...]


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
        nested: dict[str, Any] = {}
        for key, value in self.values.items():
            _merge_into(nested, nest_dotted(key, copy.deepcopy(value)))
        return nested


@dataclass
class _Param:
    """One swept key: its dotted name, where it is written, and its values or distribution."""

    key: str
    loc: Loc
    values: list[Any] = field(default_factory=list)
    distribution: Distribution | None = None


# ---------------------------------------------------------------- the recipe loader's entry


def plan_sweep(
    raw: Any, defaults: dict[str, Any] | None, taken_ids: dict[str, int], text: str | None
) -> tuple[SweepSection | None, list[PlannedRun], list[ConfigProblem]]:
    """Check a raw `[sweep]` table and expand it.

    `defaults` is the recipe's full `[defaults]` (None when they are invalid themselves:
    then the swept values are not checked, to avoid a second report of the same fault);
    `taken_ids` are the `[[runs]]` ids (full id -> index). Returns the section, the runs
    and the problems; the runs are empty whenever there is a problem.
    """
    if not isinstance(raw, dict):
        return None, [], [problem_at(("sweep",), "must be a table: write [sweep]", text)]
    section: SweepSection | None = None
    problems: list[ConfigProblem] = []
    try:
        section = SweepSection.model_validate(raw)
    except ValidationError as err:
        problems += [
            problem_at(
                ("sweep", *item["loc"]), explain_error(item, SweepSection, item["loc"]), text
            )
            for item in err.errors()
        ]
    # The swept keys are checked even when another key of [sweep] is wrong: every
    # problem is reported at once.
    grid_raw, random_raw = raw.get("grid", {}), raw.get("random", {})
    grid, grid_problems = _grid_params(
        grid_raw if isinstance(grid_raw, dict) else {}, defaults, text
    )
    sampled, random_problems = _random_params(
        random_raw if isinstance(random_raw, dict) else {}, defaults, text
    )
    problems += grid_problems + random_problems
    if section is None:
        return None, [], problems
    if problems:  # the rules below count and compare values: they need them all
        return section, [], problems
    problems += _rule_problems(section, grid, sampled, text)
    if problems:
        return section, [], problems
    runs = _expand(section, grid, sampled, _seed_of(defaults))
    if defaults is not None:
        problems += _config_problems(runs, grid + sampled, defaults, text)
    if problems:
        return section, [], problems
    runs, problems = _name_runs(section, runs, grid + sampled, taken_ids, text)
    return section, runs, problems


def expand_sweep(section: SweepSection, defaults: dict[str, Any]) -> list[PlannedRun]:
    """The runs of a sweep that `plan_sweep` accepted, in expansion order."""
    _, runs, problems = plan_sweep(section.model_dump(mode="json"), defaults, {}, None)
    if problems:
        raise ValueError("; ".join(p.render(None) for p in problems))
    return runs


def planned_runs(recipe: Recipe) -> list[PlannedRun]:
    """Every run of a valid recipe in admission order: `[[runs]]` in file order, then the
    sweep's runs in expansion order."""
    sweep_ids: dict[str, PlannedRun] = {}
    if recipe.sweep is not None:
        defaults = recipe.defaults.model_dump(mode="json")
        sweep_ids = {run.run_id: run for run in expand_sweep(recipe.sweep, defaults)}
    planned = []
    for spec in recipe.runs:
        if spec.run_id in sweep_ids:
            planned.append(sweep_ids[spec.run_id])
        else:
            planned.append(PlannedRun(spec.run_id, flatten_values(spec.overrides), "runs"))
    return planned


def flatten_values(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"lora": {"rank": 8}}` -> `{"lora.rank": 8}`; `env_args` values stay whole only when
    they are not tables."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_values(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def describe_values(values: dict[str, Any]) -> str:
    """`lr=0.003 lora.rank=8`, for tables and logs."""
    return " ".join(f"{key}={_show(value)}" for key, value in values.items())


# ---------------------------------------------------------------- keys


def sweepable_keys() -> list[str]:
    """Every dotted key a sweep may vary (`env_args.<name>` stands for any argument)."""
    keys = []
    for name, info in OrchestratorConfig.model_fields.items():
        model = _model_of(info.annotation)
        if model is not None:
            keys += [f"{name}.{inner}" for inner in model.model_fields]
        elif _is_mapping(info.annotation):
            keys += [name, f"{name}.<name>"]
        else:
            keys.append(name)
    return keys


def key_problem(key: str) -> str | None:
    """None if `key` (dotted) names an orchestrator setting, else what is wrong with it."""
    parts = key.split(".")
    model: type[BaseModel] = OrchestratorConfig
    for depth, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            candidates = [k for k in sweepable_keys() if "<" not in k]
            # `temperature` most likely means `sampling.temperature`: same last part.
            close = [k for k in candidates if k.split(".")[-1] == parts[-1]]
            close = close or difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            return f"unknown key{hint} (sweepable: {', '.join(sweepable_keys())})"
        inner = _model_of(info.annotation)
        if inner is not None:
            model = inner
            continue
        if _is_mapping(info.annotation):
            return None  # env_args: its keys are the environment's business
        if depth < len(parts) - 1:
            return f"{'.'.join(parts[: depth + 1])} is a single value, not a table"
    return None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _is_mapping(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict


# ---------------------------------------------------------------- the tables


def _flatten(
    table: dict[str, Any], is_leaf: Callable[[dict[str, Any]], bool], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in table.items():
        # `"lora.rank" = ...` (a quoted key) means the same as `lora.rank = ...`.
        path = (*prefix, *str(key).split("."))
        if isinstance(value, dict) and value and not is_leaf(value):
            yield from _flatten(value, is_leaf, path)
        else:
            yield path, value


def _params(
    table: dict[str, Any],
    where: str,
    is_leaf: Callable[[dict[str, Any]], bool],
    text: str | None,
) -> tuple[list[tuple[_Param, Any]], list[ConfigProblem]]:
    params: list[tuple[_Param, Any]] = []
    problems: list[ConfigProblem] = []
    seen: set[str] = set()
    for path, value in _flatten(table, is_leaf):
        key = ".".join(path)
        loc: Loc = ("sweep", where, *path)
        if key in seen:
            problems.append(problem_at(loc, "set twice; keep one", text))
            continue
        seen.add(key)
        problem = key_problem(key)
        if problem is not None:
            problems.append(problem_at(loc, problem, text))
            continue
        params.append((_Param(key, loc), value))
    return params, problems


def _grid_params(
    table: dict[str, Any], defaults: dict[str, Any] | None, text: str | None
) -> tuple[list[_Param], list[ConfigProblem]]:
    entries, problems = _params(table, "grid", lambda _table: False, text)
    params = []
    for param, values in entries:
        if not isinstance(values, list):
            problems.append(
                problem_at(
                    param.loc,
                    f"must be a list of values to try, e.g. {param.key} = [{_show(values)}] "
                    f"(got {_show(values)})",
                    text,
                )
            )
            continue
        if not values:
            problems.append(problem_at(param.loc, "empty list: give at least one value", text))
            continue
        param.values = values
        problems += _value_problems(param, values, defaults, text)
        params.append(param)
    return params, problems


def _is_distribution_leaf(table: dict[str, Any]) -> bool:
    return "distribution" in table or not all(isinstance(v, dict) for v in table.values())


def _random_params(
    table: dict[str, Any], defaults: dict[str, Any] | None, text: str | None
) -> tuple[list[_Param], list[ConfigProblem]]:
    entries, problems = _params(table, "random", _is_distribution_leaf, text)
    params = []
    for param, spec in entries:
        distribution, problem = _parse_distribution(param, spec, text)
        if problem:
            problems += problem
            continue
        assert distribution is not None
        param.distribution = distribution
        problems += _value_problems(param, bounds_of(distribution), defaults, text)
        params.append(param)
    return params, problems


def _parse_distribution(
    param: _Param, spec: Any, text: str | None
) -> tuple[Distribution | None, list[ConfigProblem]]:
    kinds = ", ".join(DISTRIBUTIONS)
    example = f'{param.key} = {{ distribution = "log_uniform", low = 1e-4, high = 1e-2 }}'
    if not isinstance(spec, dict):
        message = f"must be a distribution table, e.g. {example} (got {_show(spec)})"
        return None, [problem_at(param.loc, message, text)]
    kind = spec.get("distribution")
    model = DISTRIBUTIONS.get(kind) if isinstance(kind, str) else None
    if model is None:
        if kind is None:
            message = f"missing distribution: one of {kinds}, e.g. {example}"
        else:
            close = difflib.get_close_matches(str(kind), list(DISTRIBUTIONS), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            message = f"unknown distribution {kind!r}{hint} (known: {kinds})"
        return None, [problem_at((*param.loc, "distribution"), message, text)]
    try:
        return model.model_validate(spec), []  # type: ignore[return-value]
    except ValidationError as err:
        return None, [
            problem_at((*param.loc, *item["loc"]), explain_error(item, model, item["loc"]), text)
            for item in err.errors()
        ]


def _value_problems(
    param: _Param, values: list[Any], defaults: dict[str, Any] | None, text: str | None
) -> list[ConfigProblem]:
    """Each value checked as the setting it is, alone over `[defaults]` (a grid lr of -1)."""
    if defaults is None:
        return []
    problems = []
    parts = param.key.split(".")
    for number, value in enumerate(values, start=1):
        merged = _merged(defaults, {param.key: value})
        try:
            OrchestratorConfig.model_validate(merged)
        except ValidationError as err:
            for item in err.errors():
                loc = tuple(item["loc"])
                if not _related(loc, parts):
                    continue  # a rule across keys: checked once the runs are expanded
                what = (
                    f"{'low' if number == 1 else 'high'} = {_show(value)}"
                    if isinstance(param.distribution, Uniform | LogUniform | IntRange)
                    else f"value {number} of {len(values)} ({_show(value)})"
                )
                message = f"{what}: {explain_error(item, OrchestratorConfig, loc)}"
                problems.append(problem_at(param.loc, message, text))
    return problems


def _related(loc: tuple, parts: list[str]) -> bool:
    """Whether a config error at `loc` is about the swept key `parts` (or inside it)."""
    common = min(len(loc), len(parts))
    return common > 0 and list(loc[:common]) == parts[:common]


def _rule_problems(
    section: SweepSection, grid: list[_Param], sampled: list[_Param], text: str | None
) -> list[ConfigProblem]:
    problems = []
    keys = {param.key: param for param in grid}
    for param in sampled:
        if param.key in keys:
            problems.append(
                problem_at(param.loc, "also in [sweep.grid]; vary a key in one of them", text)
            )
    every = grid + sampled
    for first, second in itertools.combinations(every, 2):
        if first.key != second.key and _related(tuple(first.key.split(".")), second.key.split(".")):
            problems.append(
                problem_at(
                    second.loc,
                    f"overlaps {first.key!r}; vary either the table or the keys inside it",
                    text,
                )
            )
    if sampled and section.num_samples is None:
        problems.append(
            problem_at(
                ("sweep", "random"),
                "[sweep.random] needs num_samples in [sweep]: how many draws to make",
                text,
            )
        )
    if section.num_samples is not None and not sampled:
        problems.append(
            problem_at(
                ("sweep", "num_samples"),
                "draws of [sweep.random], which is empty; for several seeds of one "
                "configuration use repeats",
                text,
            )
        )
    if section.repeats > 1 and "seed" in {p.key for p in every}:
        seed = next(p for p in every if p.key == "seed")
        problems.append(
            problem_at(
                seed.loc,
                "repeats already vary the seed; vary seed here or set repeats, not both",
                text,
            )
        )
    count = _count(section, grid, sampled)
    if count > section.max_runs:
        factors = [f"{len(p.values)} {p.key}" for p in grid]
        if sampled:
            factors.append(f"{section.num_samples} samples")
        if section.repeats > 1:
            factors.append(f"{section.repeats} repeats")
        problems.append(
            problem_at(
                ("sweep", "max_runs") if "max_runs" in section.model_fields_set else ("sweep",),
                f"the sweep expands to {count} runs ({' x '.join(factors)}), more than "
                f"max_runs = {section.max_runs}; shrink the grid or raise [sweep] max_runs",
                text,
            )
        )
    return problems


def _count(section: SweepSection, grid: list[_Param], sampled: list[_Param]) -> int:
    if not grid and not sampled and section.repeats == 1:
        return 0  # a [sweep] with only a scheduler adds no runs
    combinations = math.prod(len(param.values) for param in grid)
    samples = (section.num_samples or 1) if sampled else 1
    return combinations * samples * section.repeats


# ---------------------------------------------------------------- expansion


def _expand(
    section: SweepSection, grid: list[_Param], sampled: list[_Param], seed: int
) -> list[PlannedRun]:
    if _count(section, grid, sampled) == 0:
        return []
    samples = (section.num_samples or 1) if sampled else 1
    runs = []
    for repeat in range(section.repeats):
        for sample in range(samples):
            drawn = {param.key: _draw(param, section.seed, sample) for param in sampled}
            for combination in itertools.product(*(param.values for param in grid)):
                values = {
                    param.key: copy.deepcopy(v) for param, v in zip(grid, combination, strict=True)
                }
                values.update(copy.deepcopy(drawn))
                if section.repeats > 1:
                    values["seed"] = seed + repeat
                runs.append(PlannedRun(run_id="", values=values))
    return runs


def _draw(param: _Param, seed: int, sample: int) -> Any:
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


def _merged(defaults: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(defaults)
    for key, value in values.items():
        _merge_into(merged, nest_dotted(key, copy.deepcopy(value)))
    return merged


def _merge_into(target: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_into(target[key], value)
        else:
            target[key] = value


def _config_problems(
    runs: list[PlannedRun], params: list[_Param], defaults: dict[str, Any], text: str | None
) -> list[ConfigProblem]:
    """Each expanded run checked whole: rules across keys (batch_size and
    rollouts_per_prompt) and configurations the sweep makes twice."""
    problems: list[ConfigProblem] = []
    failing = 0
    seen: dict[str, int] = {}
    for number, run in enumerate(runs, start=1):
        merged = _merged(defaults, run.values)
        try:
            OrchestratorConfig.model_validate(merged)
        except ValidationError as err:
            failing += 1
            if failing <= MAX_LISTED_FAILURES:
                for item in err.errors():
                    loc = tuple(item["loc"])
                    message = explain_error(item, OrchestratorConfig, loc)
                    blamed = next(
                        (p.loc for p in params if _related(loc, p.key.split("."))), ("sweep",)
                    )
                    problems.append(
                        problem_at(
                            blamed, f"run {number} ({describe_values(run.values)}): {message}", text
                        )
                    )
            continue
        fingerprint = json.dumps(merged, sort_keys=True)
        if fingerprint in seen:
            problems.append(
                problem_at(
                    ("sweep",),
                    f"runs {seen[fingerprint]} and {number} have the same configuration "
                    f"({describe_values(run.values)}); is a value listed twice?",
                    text,
                )
            )
        seen.setdefault(fingerprint, number)
    if failing > MAX_LISTED_FAILURES:
        problems.append(
            problem_at(
                ("sweep",),
                f"... and {failing - MAX_LISTED_FAILURES} more runs fail these checks",
                text,
            )
        )
    return problems


# ---------------------------------------------------------------- ids


def _name_runs(
    section: SweepSection,
    runs: list[PlannedRun],
    params: list[_Param],
    taken_ids: dict[str, int],
    text: str | None,
) -> tuple[list[PlannedRun], list[ConfigProblem]]:
    readable, why_not = _value_ids(runs, [p.key for p in params])
    if section.ids == "values" and readable is None:
        message = f'"values" cannot name these runs: {why_not}; use ids = "index" or "auto"'
        return [], [problem_at(("sweep", "ids"), message, text)]
    if section.ids == "index" or readable is None:
        width = max(2, len(str(len(runs) - 1)))
        ids = [normalize_run_id(f"{INDEX_PREFIX}{i:0{width}d}") for i in range(len(runs))]
    else:
        ids = readable
    problems = []
    for run_id in ids:
        if run_id in taken_ids:
            problems.append(
                problem_at(
                    ("runs", taken_ids[run_id], "id"),
                    f"the sweep also makes a run {run_id!r}; give this run another id",
                    text,
                )
            )
    if problems:
        return [], problems
    return [PlannedRun(run_id, run.values) for run_id, run in zip(ids, runs, strict=True)], []


def _value_ids(runs: list[PlannedRun], keys: list[str]) -> tuple[list[str] | None, str]:
    """Ids made of the values (`run_lr3e-3_rank8`), or None and the reason they cannot be."""
    keys = [*keys, "seed"] if runs and "seed" in runs[0].values and "seed" not in keys else keys
    last = [key.split(".")[-1] for key in keys]
    labels = {
        key: (name if last.count(name) == 1 else key.replace(".", "-"))
        for key, name in zip(keys, last, strict=True)
    }
    ids = []
    for run in runs:
        parts = []
        for key in keys:
            shown = _id_value(run.values[key])
            if shown is None:
                return None, f"{key} has values that do not fit in an id"
            parts.append(f"{labels[key]}{shown}")
        run_id = normalize_run_id("_".join(parts))
        if len(run_id) > MAX_READABLE_ID:
            return None, f"ids would be longer than {MAX_READABLE_ID} characters ({run_id})"
        if not layout.RUN_ID_PATTERN.match(run_id):
            return None, f"{run_id!r} is not a usable id"
        ids.append(run_id)
    duplicates = sorted({run_id for run_id in ids if ids.count(run_id) > 1})
    if duplicates:
        return None, f"two runs would both be {duplicates[0]} (values that round alike)"
    return ids, ""


def _id_value(value: Any) -> str | None:
    """How a value reads inside a run id: `3e-3`, `0p7`, `8`, `true`; None if it cannot."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value == int(value) and abs(value) < 1e4:
            return str(int(value))
        if value != 0 and not 1e-2 <= abs(value) < 1e4:
            mantissa, exponent = f"{value:.{SIGNIFICANT_DIGITS - 1}e}".split("e")
            mantissa = mantissa.rstrip("0").rstrip(".")
            return f"{mantissa}e{int(exponent)}".replace(".", "p")
        return f"{value:.{SIGNIFICANT_DIGITS}g}".replace(".", "p")
    if isinstance(value, str):
        shown = re.sub(r"[^A-Za-z0-9_-]+", "-", value).strip("-")
        return shown or None
    return None


def _show(value: Any) -> str:
    """A value as the recipe would spell it (TOML-like), for messages and tables."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_show(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)
