"""A recipe (`recipes/*.toml`) loaded into its runs: the sections, `[[runs]]` and `[sweep]`.

`load_recipe` and `recipe_from_document` validate every section (the models of
`workbench.config`), every `[[runs]]` table over `[defaults]` and the `[sweep]`, which
`workbench.sweep.expand.plan_sweep` checks and expands; bad input raises `ConfigError`
listing every problem at once, each with its file, line and key.

The runs are planned here, once per load: a `Recipe` holds each run's id, the values it
sets over `[defaults]` and where they come from (`Recipe.planned_runs`), in the order the
trainer admits them. The experiment's files, the pre-launch checks and `sweep plan` read
them there rather than expanding the sweep again.

- `Recipe`: experiment, model, inference, trainer, `[defaults]` for every run's
  orchestrator, `[[runs]]` overriding them, a `[sweep]` that expands into more runs
  (`workbench.sweep`), `[tracking]` (`workbench.tracking`), `[alerts]` (`workbench.alerts`)
  and `[slurm]` (`workbench slurm`).
- `RunSpec`: one run's id and the `[defaults]` keys it overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomlkit
from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from workbench.config import (
    VLLM_MAX_LORA_RANKS,
    AlertsSection,
    ConfigError,
    ConfigProblem,
    ExperimentSection,
    InferenceConfig,
    InferenceSection,
    ModelSection,
    OrchestratorConfig,
    SlurmSection,
    StrictModel,
    TrackingSection,
    TrainerConfig,
    TrainerSection,
    check_run_id,
    config_loc,
    deep_merge,
    default_max_loras,
    explain_error,
    normalize_run_id,
    problem_at,
    problems_from_validation,
    read_toml,
    served_lora_rank,
)
from workbench.envs import EnvironmentConfigError, environment_class
from workbench.sweep.expand import PlannedRun, plan_sweep
from workbench.sweep.spec import SweepSection
from workbench.sweep.values import flatten_values


class RunSpec(BaseModel):
    """One `[[runs]]` table: an id and any orchestrator keys that override `[defaults]`."""

    id: str = Field(
        description="letters, digits, `_` and `-`; `lr1e-3` becomes the directory and id "
        "`run_lr1e-3` (an id already starting with `run_` is kept)"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="any other key is a `[defaults]` key this run overrides; nested tables "
        "merge key by key",
    )

    @property
    def run_id(self) -> str:
        return normalize_run_id(self.id)


class Recipe(StrictModel):
    experiment: ExperimentSection = Field(
        default_factory=ExperimentSection, description="the experiment's name and directory"
    )
    model: ModelSection = Field(description="the frozen base model every run adapts")
    inference: InferenceSection = Field(
        default_factory=InferenceSection, description="the vLLM server"
    )
    trainer: TrainerSection = Field(
        default_factory=TrainerSection, description="the one trainer shared by all runs"
    )
    defaults: OrchestratorConfig = Field(
        default_factory=OrchestratorConfig,
        description="every run's `control/orch.toml` starts from this",
    )
    runs: list[RunSpec] = Field(
        default_factory=list,
        description="the runs, each an id and the `[defaults]` keys it overrides",
    )
    # Once loaded, the sweep's runs are already in `runs`, after the [[runs]].
    sweep: SweepSection | None = Field(
        None, description="runs made by varying `[defaults]` keys, after the `[[runs]]`"
    )
    tracking: TrackingSection = Field(
        default_factory=TrackingSection,
        description="every run's metrics forwarded to trackio or wandb by the supervisor",
    )
    alerts: AlertsSection = Field(
        default_factory=AlertsSection,
        description="rules the supervisor checks as records arrive: `workbench alerts`",
    )
    slurm: SlurmSection = Field(
        default_factory=SlurmSection,
        description="the batch job `workbench slurm` writes and submits; `up` ignores it",
    )

    # Set by the loader with `runs`: every run's values and where they come from.
    _planned: list[PlannedRun] = PrivateAttr(default_factory=list)
    # Set by `workbench up`'s checks: how the slots were sized, for `--dry-run`.
    _slot_arithmetic: list[str] = PrivateAttr(default_factory=list)

    @property
    def slot_arithmetic(self) -> list[str]:
        """How many slots and adapters the memory holds and why, a few lines; empty unless
        the recipe went through `workbench up`'s checks."""
        return list(self._slot_arithmetic)

    @slot_arithmetic.setter
    def slot_arithmetic(self, lines: list[str]) -> None:
        self._slot_arithmetic = list(lines)

    @property
    def planned_runs(self) -> list[PlannedRun]:
        """Every run in admission order, as the loader planned it: the `[[runs]]` tables in
        file order, then the sweep's runs in expansion order."""
        return list(self._planned)

    @property
    def output_dir(self) -> Path:
        return self.experiment.output_dir or Path("outputs") / self.experiment.name

    def run_configs(self) -> dict[str, OrchestratorConfig]:
        """Each run's orchestrator config: `[defaults]` deep-merged with its overrides."""
        base = self.defaults.model_dump(mode="json")
        return {
            spec.run_id: OrchestratorConfig.model_validate(deep_merge(base, spec.overrides))
            for spec in self.runs
        }

    def trainer_config(self) -> TrainerConfig:
        return TrainerConfig(output_dir=self.output_dir, model=self.model, trainer=self.trainer)

    @property
    def max_loras(self) -> int:
        """`[inference] max_loras`, or by default enough for every trainer slot."""
        slots = self.trainer.max_concurrent_runs
        if slots == "auto":
            raise ValueError(
                '[trainer] max_concurrent_runs = "auto" is sized before launch '
                "(workbench.supervisor.slots.resolve_auto_slots), and this recipe was not"
            )
        return self.inference.max_loras or default_max_loras(slots)

    @property
    def max_lora_rank(self) -> int | None:
        """`[inference] max_lora_rank`, or by default the smallest rank vLLM takes that
        serves the trainer's adapters; None when no rank vLLM takes does."""
        return self.inference.max_lora_rank or served_lora_rank(self.trainer.lora.rank)

    def inference_config(self) -> InferenceConfig:
        # vLLM's "auto" would downcast a float32 model to bfloat16 on CPU; sampling in the
        # trainer's precision keeps the importance ratio near 1 for unchanged weights.
        inference = self.inference.model_copy(update={"max_loras": self.max_loras})
        if inference.dtype == "auto":
            inference = inference.model_copy(update={"dtype": self.trainer.dtype})
        return InferenceConfig(
            output_dir=self.output_dir,
            model=self.model,
            inference=inference,
            max_lora_rank=self.max_lora_rank or VLLM_MAX_LORA_RANKS[-1],
        )


def load_recipe(path: Path) -> Recipe:
    document, text = read_toml(path)
    return recipe_from_document(document, path, text)


def anchor_env_paths(document: tomlkit.TOMLDocument, folder: Path) -> None:
    """Make the files a recipe's environments read (their `path_args`, e.g. the dataset's
    `path`) absolute against `folder`, the recipe's own, in `[defaults]` and every
    `[[runs]]`: each process, whatever its working directory, and the experiment's copy of
    the recipe then name the same file. An unknown environment is left to the checks."""
    defaults = document.get("defaults")
    defaults = defaults if isinstance(defaults, dict) else {}
    runs = document.get("runs")
    tables = (
        [defaults, *(run for run in runs if isinstance(run, dict))]
        if isinstance(runs, list)
        else [defaults]
    )
    for table in tables:
        env_args = table.get("env_args")
        env = table.get("env", defaults.get("env", OrchestratorConfig.model_fields["env"].default))
        if not isinstance(env_args, dict) or not isinstance(env, str):
            continue
        try:
            path_args = environment_class(env).path_args
        except EnvironmentConfigError:
            continue
        for key in path_args:
            value = env_args.get(key)
            if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
                env_args[key] = str((folder / value).resolve())
            elif isinstance(value, str) and value.startswith("~"):
                env_args[key] = str(Path(value).expanduser())


def recipe_from_document(
    document: tomlkit.TOMLDocument, path: Path | str | None, text: str | None = None
) -> Recipe:
    """Validate a parsed recipe and plan its runs, the sweep's expanded once; every problem
    of every run is reported at once."""
    if path is not None:
        anchor_env_paths(document, Path(path).resolve().parent)
    text = text if text is not None else tomlkit.dumps(document)
    raw = document.unwrap()
    problems: list[ConfigProblem] = []
    runs_raw = _runs_tables(raw, text, problems)
    sweep_raw = raw.pop("sweep", None)
    recipe = _validated_sections(raw, text, problems)
    defaults = raw.get("defaults", {}) if isinstance(raw.get("defaults", {}), dict) else {}
    specs, planned, seen = _listed_runs(runs_raw, defaults, text, problems, recipe is not None)
    sweep = None
    if sweep_raw is not None:
        rank = recipe.trainer.lora.rank if recipe is not None else None
        sweep, sweep_runs = _swept_runs(sweep_raw, defaults, seen, text, rank, problems)
        specs += [RunSpec(id=run.run_id, overrides=run.overrides) for run in sweep_runs]
        planned += sweep_runs
    if problems:
        raise ConfigError(path, problems)
    assert recipe is not None
    recipe.runs = specs
    recipe.sweep = sweep
    recipe._planned = planned
    return recipe


def _runs_tables(raw: dict, text: str, problems: list[ConfigProblem]) -> list[dict]:
    """The recipe's [[runs]] tables, taken out of `raw`; none if they are not tables."""
    runs_raw = raw.pop("runs", [])
    if not isinstance(runs_raw, list) or not all(isinstance(r, dict) for r in runs_raw):
        problems.append(
            problem_at(("runs",), "must be an array of tables: write each run as [[runs]]", text)
        )
        return []
    return runs_raw


def _validated_sections(raw: dict, text: str, problems: list[ConfigProblem]) -> Recipe | None:
    """The recipe's sections and [defaults] validated, or None with their problems."""
    try:
        return Recipe.model_validate(raw)
    except ValidationError as err:
        problems.extend(problems_from_validation(err, Recipe, text))
        return None


def _listed_runs(
    runs_raw: list[dict],
    defaults: dict,
    text: str,
    problems: list[ConfigProblem],
    sections_valid: bool,
) -> tuple[list[RunSpec], list[PlannedRun], dict[str, int]]:
    """Each [[runs]] table with a valid, new id, as a spec and a planned run; the ids seen,
    with their table's index. A run's config is checked over [defaults]."""
    specs: list[RunSpec] = []
    planned: list[PlannedRun] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(runs_raw):
        table = dict(table)
        run_id = table.pop("id", None)
        full_id = _new_run_id(run_id, i, seen, text, problems)
        if full_id is None:
            continue
        seen[full_id] = i
        _check_run_config(table, defaults, i, text, problems, sections_valid)
        specs.append(RunSpec(id=run_id, overrides=table))
        planned.append(PlannedRun(full_id, flatten_values(table), "runs"))
    return specs, planned, seen


def _new_run_id(
    run_id: Any, i: int, seen: dict[str, int], text: str, problems: list[ConfigProblem]
) -> str | None:
    """Run `i`'s full id, or None with the problem: missing, not a string, invalid or taken."""
    if not isinstance(run_id, str):
        message = (
            'missing: every [[runs]] needs id = "..."'
            if run_id is None
            else (f"must be a string, got {type(run_id).__name__}")
        )
        problems.append(problem_at(("runs", i, "id"), message, text))
        return None
    bad_id = check_run_id(run_id)
    if bad_id:
        problems.append(problem_at(("runs", i, "id"), bad_id, text))
        return None
    full_id = normalize_run_id(run_id)
    if full_id in seen:
        problems.append(
            problem_at(
                ("runs", i, "id"),
                f"duplicate run id {full_id!r} (also used by run number {seen[full_id] + 1}); "
                "give every run its own id",
                text,
            )
        )
        return None
    return full_id


def _check_run_config(
    table: dict,
    defaults: dict,
    i: int,
    text: str,
    problems: list[ConfigProblem],
    sections_valid: bool,
) -> None:
    """Run `i`'s config over [defaults]; each problem goes to the run or to [defaults]."""
    try:
        OrchestratorConfig.model_validate(deep_merge(defaults, table))
    except ValidationError as err:
        for item in err.errors():
            message = explain_error(item, OrchestratorConfig, tuple(item["loc"]))
            inner = config_loc(OrchestratorConfig, tuple(item["loc"]))
            # A key the run sets is the run's fault, and so is a rule across keys
            # (empty loc) once the run overrides anything; otherwise [defaults] is.
            if (inner and inner[0] in table) or (not inner and table):
                problems.append(problem_at(("runs", i, *inner), message, text))
            elif sections_valid:  # else recipe-level validation reported it
                problems.append(problem_at(("defaults", *inner), message, text))


def _swept_runs(
    sweep_raw: Any,
    defaults: dict,
    seen: dict[str, int],
    text: str,
    rank: int | None,
    problems: list[ConfigProblem],
) -> tuple[SweepSection | None, list[PlannedRun]]:
    """The [sweep] checked and expanded over valid [defaults], after the listed runs."""
    try:
        valid_defaults = OrchestratorConfig.model_validate(defaults).model_dump(mode="json")
    except ValidationError:
        valid_defaults = None  # already reported; checking swept values would repeat it
    sweep, sweep_runs, sweep_problems = plan_sweep(sweep_raw, valid_defaults, seen, text, rank)
    problems.extend(sweep_problems)
    return sweep, sweep_runs
