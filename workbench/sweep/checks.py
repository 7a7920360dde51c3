"""Checks of a `[sweep]` table, each problem at its file, line and key.

- keys: every swept key must name an orchestrator setting (`key_problem`);
- values: each grid value and distribution bound, alone over `[defaults]`, must be a
  valid setting (a grid lr of -1 is reported at `sweep.grid.lr`);
- rules: a key in both grid and random, overlapping keys, `num_samples` without
  `[sweep.random]`, `seed` swept with repeats, more runs than `max_runs`;
- runs: every expanded run's whole config must be valid (rules across keys), and no two
  runs may be the same.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from workbench.config import (
    ConfigProblem,
    OrchestratorConfig,
    config_loc,
    explain_error,
    lora_rank_problem,
    problem_at,
    tagged_members,
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
from workbench.sweep.values import describe_values, merged, show_value

# Runs whose expanded config fails a check are listed up to this many; the rest are counted.
MAX_LISTED_FAILURES = 5

Loc = tuple[str | int, ...]


@dataclass
class Param:
    """One swept key: its dotted name, where it is written, and its values or distribution."""

    key: str
    loc: Loc
    values: list[Any] = field(default_factory=list)
    distribution: Distribution | None = None


def read_params(
    raw: dict[str, Any], defaults: dict[str, Any] | None, text: str | None
) -> tuple[list[Param], list[Param], list[ConfigProblem]]:
    """The grid and random keys of a raw `[sweep]`, each checked; and the problems."""
    grid_raw, random_raw = raw.get("grid", {}), raw.get("random", {})
    grid, problems = _grid_params(grid_raw if isinstance(grid_raw, dict) else {}, defaults, text)
    sampled, random_problems = _random_params(
        random_raw if isinstance(random_raw, dict) else {}, defaults, text
    )
    return grid, sampled, problems + random_problems


# ---------------------------------------------------------------- keys


def sweepable_keys() -> list[str]:
    """Every dotted key a sweep may vary (`env_args.<name>` stands for any argument; a
    table of several kinds, `loss`, lists every kind's keys)."""
    keys = []
    for name, info in OrchestratorConfig.model_fields.items():
        models = _models_of(info.annotation)
        if models:
            inner = dict.fromkeys(key for model in models for key in model.model_fields)
            keys += [f"{name}.{key}" for key in inner]
        elif _is_mapping(info.annotation):
            keys += [name, f"{name}.<name>"]
        else:
            keys.append(name)
    return keys


def key_problem(key: str) -> str | None:
    """None if `key` (dotted) names an orchestrator setting, else what is wrong with it.
    A key of any kind of `loss` is one: whether the run's kind takes it is the config's
    check, with the run's values."""
    parts = key.split(".")
    models: list[type[BaseModel]] = [OrchestratorConfig]
    for depth, part in enumerate(parts):
        info = next((m.model_fields[part] for m in models if part in m.model_fields), None)
        if info is None:
            candidates = [k for k in sweepable_keys() if "<" not in k]
            # `temperature` most likely means `sampling.temperature`: same last part.
            close = [k for k in candidates if k.split(".")[-1] == parts[-1]]
            close = close or difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            return f"unknown key{hint} (sweepable: {', '.join(sweepable_keys())})"
        inner = _models_of(info.annotation)
        if inner:
            models = inner
            continue
        if _is_mapping(info.annotation):
            return None  # env_args: its keys are the environment's business
        if depth < len(parts) - 1:
            return f"{'.'.join(parts[: depth + 1])} is a single value, not a table"
    return None


def _models_of(annotation: Any) -> list[type[BaseModel]]:
    """The table a field holds: its model, or every kind of a tagged union (`loss`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return list(tagged_members(annotation).values())


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
) -> tuple[list[tuple[Param, Any]], list[ConfigProblem]]:
    params: list[tuple[Param, Any]] = []
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
        params.append((Param(key, loc), value))
    return params, problems


def _grid_params(
    table: dict[str, Any], defaults: dict[str, Any] | None, text: str | None
) -> tuple[list[Param], list[ConfigProblem]]:
    entries, problems = _params(table, "grid", lambda _table: False, text)
    params = []
    for param, values in entries:
        if not isinstance(values, list):
            problems.append(
                problem_at(
                    param.loc,
                    f"must be a list of values to try, e.g. {param.key} = [{show_value(values)}] "
                    f"(got {show_value(values)})",
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
) -> tuple[list[Param], list[ConfigProblem]]:
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
    param: Param, spec: Any, text: str | None
) -> tuple[Distribution | None, list[ConfigProblem]]:
    kinds = ", ".join(DISTRIBUTIONS)
    example = f'{param.key} = {{ distribution = "log_uniform", low = 1e-4, high = 1e-2 }}'
    if not isinstance(spec, dict):
        message = f"must be a distribution table, e.g. {example} (got {show_value(spec)})"
        return None, [problem_at(param.loc, message, text)]
    kind = spec.get("distribution")
    model = DISTRIBUTIONS.get(kind) if isinstance(kind, str) else None
    if model is None:
        if kind is None:
            message = f"missing distribution: one of {kinds}, e.g. {example}"
            return None, [problem_at(param.loc, message, text)]
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
    param: Param, values: list[Any], defaults: dict[str, Any] | None, text: str | None
) -> list[ConfigProblem]:
    """Each value checked as the setting it is, alone over `[defaults]` (a grid lr of -1)."""
    if defaults is None:
        return []
    problems = []
    parts = param.key.split(".")
    for number, value in enumerate(values, start=1):
        config = merged(defaults, {param.key: value})
        try:
            OrchestratorConfig.model_validate(config)
        except ValidationError as err:
            for item in err.errors():
                loc = tuple(item["loc"])
                if not _related(config_loc(OrchestratorConfig, loc), parts):
                    continue  # a rule across keys: checked once the runs are expanded
                what = (
                    f"{'low' if number == 1 else 'high'} = {show_value(value)}"
                    if isinstance(param.distribution, Uniform | LogUniform | IntRange)
                    else f"value {number} of {len(values)} ({show_value(value)})"
                )
                message = f"{what}: {explain_error(item, OrchestratorConfig, loc)}"
                problems.append(problem_at(param.loc, message, text))
    return problems


def _related(loc: tuple, parts: list[str]) -> bool:
    """Whether a config error at `loc` is about the swept key `parts` (or inside it)."""
    common = min(len(loc), len(parts))
    return common > 0 and list(loc[:common]) == parts[:common]


def rule_problems(
    section: SweepSection, grid: list[Param], sampled: list[Param], text: str | None
) -> list[ConfigProblem]:
    """[sweep]'s rules across its tables: no key varied twice, draws with a count, no
    repeats beside a varied seed, at most max_runs runs."""
    return [
        *_overlap_problems(grid, sampled, text),
        *_draw_problems(section, grid, sampled, text),
        *_size_problems(section, grid, sampled, text),
    ]


def _overlap_problems(
    grid: list[Param], sampled: list[Param], text: str | None
) -> list[ConfigProblem]:
    """A key varied twice: in both tables, or as a table and a key inside it."""
    problems = []
    keys = {param.key: param for param in grid}
    for param in sampled:
        if param.key in keys:
            problems.append(
                problem_at(param.loc, "also in [sweep.grid]; vary a key in one of them", text)
            )
    for first, second in itertools.combinations(grid + sampled, 2):
        if first.key != second.key and _related(tuple(first.key.split(".")), second.key.split(".")):
            problems.append(
                problem_at(
                    second.loc,
                    f"overlaps {first.key!r}; vary either the table or the keys inside it",
                    text,
                )
            )
    return problems


def _draw_problems(
    section: SweepSection, grid: list[Param], sampled: list[Param], text: str | None
) -> list[ConfigProblem]:
    """num_samples without [sweep.random] or the other way round; repeats beside a seed."""
    problems = []
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
    every = grid + sampled
    if section.repeats > 1 and "seed" in {p.key for p in every}:
        seed = next(p for p in every if p.key == "seed")
        problems.append(
            problem_at(
                seed.loc,
                "repeats already vary the seed; vary seed here or set repeats, not both",
                text,
            )
        )
    return problems


def _size_problems(
    section: SweepSection, grid: list[Param], sampled: list[Param], text: str | None
) -> list[ConfigProblem]:
    """More runs than max_runs, with the factors that make them."""
    count = count_runs(section, grid, sampled)
    if count <= section.max_runs:
        return []
    factors = [f"{len(p.values)} {p.key}" for p in grid]
    if sampled:
        factors.append(f"{section.num_samples} samples")
    if section.repeats > 1:
        factors.append(f"{section.repeats} repeats")
    return [
        problem_at(
            ("sweep", "max_runs") if "max_runs" in section.model_fields_set else ("sweep",),
            f"the sweep expands to {count} runs ({' x '.join(factors)}), more than "
            f"max_runs = {section.max_runs}; shrink the grid or raise [sweep] max_runs",
            text,
        )
    ]


def rank_problems(
    params: list[Param], trainer_rank: int | None, text: str | None
) -> list[ConfigProblem]:
    """A swept `lora.rank` above the trainer's slots would be rejected by the trainer at
    run time: say so now."""
    if trainer_rank is None:
        return []
    problems = []
    for param in params:
        if param.key != "lora.rank":
            continue
        values = bounds_of(param.distribution) if param.distribution else param.values
        refusals = [
            lora_rank_problem(value, trainer_rank) for value in values if isinstance(value, int)
        ]
        first = next((refusal for refusal in refusals if refusal), None)
        if first:
            problems.append(problem_at(param.loc, first, text))
    return problems


def count_runs(section: SweepSection, grid: list[Param], sampled: list[Param]) -> int:
    if not grid and not sampled and section.repeats == 1:
        return 0  # a [sweep] with only a scheduler adds no runs
    combinations = math.prod(len(param.values) for param in grid)
    samples = (section.num_samples or 1) if sampled else 1
    return combinations * samples * section.repeats


def config_problems(
    runs: list[dict[str, Any]], params: list[Param], defaults: dict[str, Any], text: str | None
) -> list[ConfigProblem]:
    """Each expanded run checked whole: rules across keys (batch_size and
    rollouts_per_prompt) and configurations the sweep makes twice."""
    problems: list[ConfigProblem] = []
    failing = 0
    seen: dict[str, int] = {}
    for number, values in enumerate(runs, start=1):
        config = merged(defaults, values)
        try:
            OrchestratorConfig.model_validate(config)
        except ValidationError as err:
            failing += 1
            if failing <= MAX_LISTED_FAILURES:
                for item in err.errors():
                    loc = tuple(item["loc"])
                    message = explain_error(item, OrchestratorConfig, loc)
                    blamed = next(
                        (
                            p.loc
                            for p in params
                            if _related(config_loc(OrchestratorConfig, loc), p.key.split("."))
                        ),
                        ("sweep",),
                    )
                    problems.append(
                        problem_at(
                            blamed, f"run {number} ({describe_values(values)}): {message}", text
                        )
                    )
            continue
        fingerprint = json.dumps(config, sort_keys=True)
        if fingerprint in seen:
            problems.append(
                problem_at(
                    ("sweep",),
                    f"runs {seen[fingerprint]} and {number} have the same configuration "
                    f"({describe_values(values)}); is a value listed twice?",
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
