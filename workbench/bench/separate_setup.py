"""One experiment of `workbench bench e2e --vs separate`: its runs, its recipe, run headless,
and what it measured (wall time, CPU by role, peak memory, each run's curve).

`separate` compares the setups these make; `seed_control` trains a split run alone under
other seeds with the same pieces.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.bench.headless import (
    HeadlessRun,
    Launch,
    as_typed,
    run_accounted,
    run_accounted_together,
    up_command,
)
from workbench.bench.process_trees import ROLES, TreeSampler, TreeWatch
from workbench.files import busy, layout

DEFAULT_RECIPE = Path("recipes/reverse_text.toml")
# The first 8 as measured since issue 21 (a run count's figures stay comparable); then the
# half and quarter steps between them, so 16 and 32 runs stay in the range that learns.
LEARNING_RATES = (
    *(1e-3, 2e-3, 3e-3, 5e-3, 4e-3, 6e-3, 7e-3, 8e-3),
    *(1.5e-3, 2.5e-3, 3.5e-3, 4.5e-3, 5.5e-3, 6.5e-3, 7.5e-3, 8.5e-3),
    *(1.25e-3, 1.75e-3, 2.25e-3, 2.75e-3, 3.25e-3, 3.75e-3, 4.25e-3, 4.75e-3),
    *(5.25e-3, 5.75e-3, 6.25e-3, 6.75e-3, 7.25e-3, 7.75e-3, 8.25e-3, 8.75e-3),
)
DEFAULT_RUNS = 4
# How far a run's reward_mean may be from its shared curve at a step that sampled with the
# same adapter version. Not zero: a run packed beside others goes through matmuls of other
# shapes, so its adapter differs from its lone twin's in the last bits (the trainer's
# isolation tests: within 1e-7), and one completion sampled differently in a late step of
# a 128-sample batch moves the mean by about 0.001; a change in learning moves it by more.
CURVE_TOLERANCE = 0.05
DEFAULT_MAX_STEPS = 20  # as measured in issue 21
QUICK_RUNS, QUICK_MAX_STEPS = 2, 5
SETUPS = ("shared", "one_after_another", "at_once")
MEMORY_HEADROOM = 0.85
DEFAULT_TIMEOUT_S = 2 * 3600.0  # per experiment
# Busy records that hold a whole run, so its breakdown covers all of it.
WHOLE_RUN_WINDOW_S = str(30 * 24 * 3600)


class SeparateBenchError(ValueError):
    """A recipe or run count this benchmark cannot use."""


def run_id_for(lr: float) -> str:
    """`lr1e-3` for 1e-3: the learning rate in the run's id."""
    exponent = math.floor(math.log10(lr))
    mantissa = round(lr / 10**exponent, 6)
    text = f"{int(mantissa)}" if mantissa.is_integer() else f"{mantissa:g}".replace(".", "p")
    return f"lr{text}e{exponent}"


@dataclass(frozen=True)
class Experiment:
    name: str
    recipe: Path
    cwd: Path  # `up` runs here; the experiment lands under it
    run_ids: tuple[str, ...]

    @property
    def directory(self) -> Path:
        return self.cwd / "outputs" / self.name


def write_recipes(recipe: Path, runs: int, scratch: Path) -> dict[str, list[Experiment]]:
    """The recipes of every setup, written under `scratch`: one experiment of the N runs,
    and N of one run each (the same experiments serve both separate setups)."""
    if not 1 <= runs <= len(LEARNING_RATES):
        raise SeparateBenchError(f"--runs must be 1 to {len(LEARNING_RATES)}, not {runs}")
    every_run = [BenchRun(run_id_for(lr), lr) for lr in LEARNING_RATES[:runs]]
    base = recipe.stem
    separate = [
        write_experiment(recipe, f"{base}_{run.id}", [run], runs, scratch / "separate" / run.id)
        for run in every_run
    ]
    shared = write_experiment(recipe, f"{base}_shared", every_run, runs, scratch / "shared")
    return {"shared": [shared], "separate": separate}


@dataclass(frozen=True)
class BenchRun:
    """One `[[runs]]` table of a benchmark experiment: the recipe's run, but its id, its
    learning rate and (for a seed control) its seed."""

    id: str
    lr: float
    seed: int | None = None


def write_experiment(
    recipe: Path, name: str, runs: list[BenchRun], slots: int, directory: Path
) -> Experiment:
    """RECIPE with `runs` for its `[[runs]]`, under `directory`. Every experiment of one
    benchmark gets the slots and adapters of its largest (`slots` runs): vLLM's adapter
    batch and the trainer's slots are then the same, so a run is the same run everywhere."""
    import tomlkit

    from workbench.config import parse_toml

    text = recipe.read_text(encoding="utf-8")
    document = parse_toml(text, recipe)
    if "sweep" in document:
        raise SeparateBenchError(f"{recipe}: a [sweep] recipe; give one with plain [[runs]]")
    document.setdefault("experiment", tomlkit.table())
    document["experiment"]["name"] = name
    document["experiment"]["output_dir"] = f"outputs/{name}"
    for section, key, value in (("trainer", "max_concurrent_runs", slots),
                                ("inference", "max_loras", 2 * slots)):  # fmt: skip
        table = document.setdefault(section, tomlkit.table())
        table[key] = max(int(table.get(key, 0)), value)
    tables = tomlkit.aot()
    for run in runs:
        table = tomlkit.table()
        table["id"] = run.id
        table["lr"] = run.lr
        if run.seed is not None:
            table["seed"] = run.seed
        tables.append(table)
    document["runs"] = tables
    directory.mkdir(parents=True)
    path = directory / f"{name}.toml"
    path.write_text(document.as_string(), encoding="utf-8")
    return Experiment(name, path, directory, tuple(run.id for run in runs))


# ---------------------------------------------------------------- running a setup


def run_setup(
    setup: str, experiments: list[Experiment], *, max_steps: int, timeout_s: float
) -> dict[str, Any]:
    """Run the setup's experiments (together for `at_once`, else one after the other)."""
    env = {busy.WINDOW_ENV: WHOLE_RUN_WINDOW_S}
    started_at = time.time()
    load_before = os.getloadavg()
    with TreeSampler() as sampler:
        if setup == "at_once":
            pending = list(experiments)
            launches = [
                Launch(up_command(e.recipe, max_steps), e.cwd, e.cwd / "up.log")
                for e in experiments
            ]
            runs, cpu_s, unreaped = run_accounted_together(
                launches,
                timeout_s=timeout_s,
                env=env,
                on_start=lambda pid: sampler.watch(pending.pop(0).name, pid),
            )
        else:
            runs, cpu_s, unreaped = [], 0.0, 0
            for e in experiments:
                run = run_accounted(
                    up_command(e.recipe, max_steps),
                    e.cwd,
                    timeout_s=timeout_s,
                    env=env,
                    on_start=lambda pid, name=e.name: sampler.watch(name, pid),
                )
                runs.append(run)
                cpu_s = None if cpu_s is None or run.cpu_s is None else cpu_s + run.cpu_s
                unreaped += run.unreaped
    wall_s = time.time() - started_at
    return setup_result(
        setup, experiments, runs, sampler, started_at=started_at, wall_s=wall_s,
        cpu_s=cpu_s, unreaped=unreaped, load_before=load_before,
    )  # fmt: skip


def _unfinished(experiment: Experiment, run: HeadlessRun) -> list[str]:
    """What did not end as it should: the experiment timing out, a run not finished."""
    from workbench.status import run_statuses

    problems = [f"{experiment.name}: timed out after {run.wall_s:.0f} s"] if run.timed_out else []
    for status in run_statuses(experiment.directory):
        if status.status != "finished":
            problems.append(f"{experiment.name} {status.id}: {status.status} {status.reason or ''}")
    return problems


def _experiment_result(experiment: Experiment, run: HeadlessRun, tree: TreeWatch) -> dict[str, Any]:
    """One experiment's part of a setup's result: its command, times, steps, process tree
    and where its processes' time went."""
    from workbench.bench.sweep import trained_steps

    directory = experiment.directory
    return {
        "name": experiment.name,
        "command": as_typed(run.command),
        "exit_code": run.exit_code,
        "wall_s": round(run.wall_s, 1),
        "cpu_s": None if run.cpu_s is None else round(run.cpu_s, 1),
        "run_steps": trained_steps(directory),
        **tree.to_json(),
        "time_breakdown": busy.experiment_breakdown(
            busy.BusyReader(directory).records(), _inference_started_at(directory)
        ),
    }


def setup_result(
    setup: str,
    experiments: list[Experiment],
    runs: list[HeadlessRun],
    sampler: TreeSampler,
    *,
    started_at: float,
    wall_s: float,
    cpu_s: float | None,
    unreaped: int,
    load_before: tuple[float, float, float],
) -> dict[str, Any]:
    trees = {tree.name: tree for tree in sampler.trees}
    per_experiment, run_curves, problems, breakdowns = [], {}, [], []
    machine_busy = sum(r.machine_busy_s or 0.0 for r in runs) if setup != "at_once" else None
    if setup == "at_once" and runs:
        machine_busy = runs[0].machine_busy_s
    for experiment, run in zip(experiments, runs, strict=True):
        problems += _unfinished(experiment, run)
        for run_id in experiment.run_ids:
            run_dir = layout.run_dir(experiment.directory, f"run_{run_id}")
            run_curves[run_id] = run_curve(run_dir, started_at)
        tree = trees.get(experiment.name, TreeWatch(experiment.name, 0))
        per_experiment.append(_experiment_result(experiment, run, tree))
        breakdowns.append(per_experiment[-1]["time_breakdown"])
    run_steps = sum(e["run_steps"] for e in per_experiment)
    by_role = {
        role: round(sum(e["cpu_s_by_role"][role] for e in per_experiment), 1) for role in ROLES
    }
    return {
        "setup": setup,
        "experiments": len(experiments),
        "wall_s": round(wall_s, 1),
        "run_steps": run_steps,
        "run_steps_per_hour": round(run_steps / wall_s * 3600, 1) if wall_s > 0 else None,
        "cpu_s": None if cpu_s is None else round(cpu_s, 1),
        "cpu_s_by_role": by_role,
        "foreign_cpu_s": None
        if cpu_s is None or machine_busy is None
        else round(max(0.0, machine_busy - cpu_s), 1),
        "peak_rss_mb": round(sampler.peak_total_rss_bytes / 2**20),
        "unreaped_processes": unreaped,
        "load_average_before": [round(x, 2) for x in load_before],
        "problems": problems,
        "time_breakdown": {
            part: busy.mean_summary([b[part] for b in breakdowns if part in b], "experiments")
            for part in ("trainer", "orchestrators", busy.INFERENCE)
        },
        "runs": run_curves,
        "per_experiment": per_experiment,
    }


def run_curve(run: Path, started_at: float) -> dict[str, Any]:
    """A run's orchestrator steps (step, reward_mean, policy_version) in the order written,
    and the seconds from the setup's start to its first and last step."""
    from workbench.files.metrics import read_metrics

    records = [r for r in read_metrics(run, "orchestrator") if "reward_mean" in r]
    times = [r["time"] for r in records if isinstance(r.get("time"), int | float)]
    return {
        "steps": len({r["step"] for r in records}),
        "first_step_s": round(min(times) - started_at, 1) if times else None,
        "last_step_s": round(max(times) - started_at, 1) if times else None,
        "curve": [[r["step"], r["reward_mean"], r.get("policy_version")] for r in records],
    }


def _inference_started_at(experiment: Path) -> float | None:
    from workbench.supervisor.client import read_state
    from workbench.system.clock import unix_time

    record = ((read_state(experiment) or {}).get("processes") or {}).get("inference") or {}
    return unix_time(record.get("started_at"))
