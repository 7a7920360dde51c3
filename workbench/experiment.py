"""Creating an experiment directory from a recipe, and finding experiments and runs in it.

Used by the CLI and the supervisor. Writing `control/orch.toml` is the handshake that makes
a directory a run (docs/contracts.md), so it is written last and atomically.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from workbench.config import OrchestratorConfig, model_to_toml, normalize_run_id
from workbench.files import layout
from workbench.recipe import Recipe
from workbench.sweep.files import write_plan
from workbench.sweep.values import describe_values

DEFAULT_OUTPUTS = Path("outputs")


class RunLookupError(LookupError):
    """A run id that names no run, or more than one."""


def orch_toml_text(run_id: str, config: OrchestratorConfig, note: str | None = None) -> str:
    header = (
        f"Orchestrator config of {run_id}, written by workbench.\n"
        "Edit before the run starts; the trainer validates it when it discovers the run."
    )
    if note:
        header += "\n" + note
    return model_to_toml(config, header=header)


def write_run(experiment: Path, run_id: str, config: OrchestratorConfig) -> Path:
    """Create `run_<id>/` with its `control/orch.toml`; an identical file is left untouched."""
    return _write_run(experiment, run_id, config)[0]


def _write_run(
    experiment: Path, run_id: str, config: OrchestratorConfig, note: str | None = None
) -> tuple[Path, bool]:
    run = layout.run_dir(experiment, run_id)
    path = layout.orch_config_path(run)
    text = orch_toml_text(run_id, config, note)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return run, False
    layout.atomic_write_text(path, text)
    return run, True


def create_experiment(recipe: Recipe, document: tomlkit.TOMLDocument) -> Path:
    """Write `recipe.toml` (the resolved recipe, comments kept), one run directory per run
    (`[[runs]]`, then the sweep's) and, for a sweep, `sweep/plan.json`."""
    experiment = recipe.output_dir
    experiment.mkdir(parents=True, exist_ok=True)
    layout.atomic_write_text(layout.recipe_path(experiment), tomlkit.dumps(document))
    planned = {run.run_id: run for run in recipe.planned_runs}
    written = []
    for run_id, config in recipe.run_configs().items():
        run_plan = planned[run_id]
        note = (
            f"Sweep values: {describe_values(run_plan.values)}"
            if run_plan.source == "sweep"
            else None
        )
        run, changed = _write_run(experiment, run_id, config, note)
        if changed:
            written.append(layout.orch_config_path(run))
    queue_in_order(written)
    if recipe.sweep is not None:
        write_plan(experiment, list(planned.values()), recipe.trainer.max_concurrent_runs)
    return experiment


def queue_in_order(orch_tomls: list[Path]) -> None:
    """Give the runs' `orch.toml` files increasing modification times in list order.

    The trainer admits waiting runs oldest config first (ties by run id); files written in
    one loop often share a clock tick, which would put a sweep's runs in id order rather
    than the recipe's. Each gets a distinct time, 1 us apart, all in the past.
    """
    now = time.time_ns()
    for position, path in enumerate(orch_tomls):
        stamp = now - (len(orch_tomls) - position) * 1000
        os.utime(path, ns=(stamp, stamp))


def is_experiment(path: Path) -> bool:
    return path.is_dir() and (
        layout.recipe_path(path).is_file() or bool(layout.list_run_dirs(path))
    )


def find_experiments(root: Path = DEFAULT_OUTPUTS) -> list[Path]:
    """Experiments directly under `root` (and `root` itself if it is one)."""
    if not root.is_dir():
        return []
    found = [root] if is_experiment(root) else []
    found += sorted(p for p in root.iterdir() if is_experiment(p))
    return found


def resolve_experiment(explicit: Path | None, root: Path = DEFAULT_OUTPUTS) -> Path:
    """The experiment a command acts on: the one given, or the only one under ./outputs."""
    if explicit is not None:
        if not explicit.exists():
            raise RunLookupError(f"{explicit} does not exist: pass an experiment directory")
        if not is_experiment(explicit):
            raise RunLookupError(
                f"{explicit} is not an experiment directory (no recipe.toml and no run_* inside)"
            )
        return explicit
    found = find_experiments(root)
    if not found:
        raise RunLookupError(
            f"no experiment found under ./{root}; pass the experiment directory explicitly"
        )
    if len(found) > 1:
        listing = "\n".join(f"  {p}" for p in found)
        raise RunLookupError(f"several experiments under ./{root}; name one of:\n{listing}")
    return found[0]


@dataclass(frozen=True)
class RunRef:
    experiment: Path
    run_id: str

    @property
    def path(self) -> Path:
        return layout.run_dir(self.experiment, self.run_id)


def resolve_run(
    run_id: str, experiment: Path | None = None, root: Path = DEFAULT_OUTPUTS
) -> RunRef:
    """Find a run by id in one experiment, or in every experiment under ./outputs.

    The `run_` prefix may be left out. Unknown and ambiguous ids raise `RunLookupError`
    listing the candidates.
    """
    experiments = [experiment] if experiment is not None else find_experiments(root)
    wanted = {run_id, normalize_run_id(run_id)}
    matches = [
        RunRef(exp, name)
        for exp in experiments
        for name in sorted(wanted)
        if layout.run_dir(exp, name).is_dir()
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = [f"  {exp / p.name}" for exp in experiments for p in layout.list_run_dirs(exp)]
        where = str(experiment) if experiment is not None else f"the experiments under ./{root}"
        listing = "\n".join(known) if known else "  (none)"
        raise RunLookupError(f"no run {run_id!r} in {where}. Runs there:\n{listing}")
    listing = "\n".join(f"  {m.path}" for m in matches)
    raise RunLookupError(
        f"run id {run_id!r} is ambiguous; pass --experiment with one of:\n{listing}"
    )
