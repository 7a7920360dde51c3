"""`workbench bench sweep`: a sweep with early stopping (ASHA), with population-based
training (PBT) and with every configuration run to max_steps.

The recipe (by default the shipped `recipes/reverse_text_sweep.toml`) runs three times, one
after the other, on the same machine with the same trainer slots: first as written, with
its `[sweep.scheduler]` (ASHA); then with PBT in its place (`pbt_recipe`: the same metric,
judged every `pbt_interval` steps, a checkpoint at each); then with the scheduler removed
("exhaustive": every configuration to `max_steps`). Each is `workbench up RECIPE --headless` in its own scratch directory
(`workbench.bench.headless`: wall time from the launch to the exit, vLLM start included,
and CPU-seconds of the experiment's whole process tree). ASHA goes first, so a cold start
(page cache, first imports) would count against it, not for it.

The winner of each is what `workbench sweep report` names (`workbench.sweep.report`: the
best metric at a run's last eval). Each scheduler is compared with the exhaustive sweep:
- whether both name the same configuration (a PBT winner is a fork, `run_x-pbtN`, with
  a lineage: never a configuration of the exhaustive sweep);
- the gap between the winners' final eval rewards (exhaustive minus the scheduler's);
- the regret of the scheduler's pick: the exhaustive winner's final reward minus what the
  pick reached in the exhaustive sweep (the same configuration, trained to the end there);
- the ratios of wall time and of CPU-seconds.
Target (issue 8, for ASHA; PBT is held to the same): the winner within 0.02 eval reward of
the exhaustive winner, in at most 0.5x its wall time.

Results: `benchmarks/results/sweep-*.json` and a PNG (`sweep-latest.png`): each mode's eval
curves by step (as `sweep report` draws them) and, for both, the best eval reward a report
would have named at each moment, against wall-clock time.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.bench.headless import HeadlessRun, run_up_headless
from workbench.files import layout
from workbench.files.metrics import read_metrics
from workbench.status import run_statuses
from workbench.sweep.report import SweepReport, build_report

DEFAULT_RECIPE = Path("recipes/reverse_text_sweep.toml")
DEFAULT_TIMEOUT_S = 2 * 3600.0  # per mode; the shipped sweep's target is 25 minutes
# `--quick` (and `bench all --quick`): the same sweep, 10 steps a run (one rung, at 5).
QUICK_MAX_STEPS = 10
REWARD_TOLERANCE = 0.02
WALL_RATIO_TARGET = 0.5
MODES = ("asha", "pbt", "exhaustive")
# PBT in the benchmark: the bottom quarter takes a checkpoint of the top quarter.
PBT_QUANTILE = 0.25
# Evictions that are outcomes of a sweep, not failures: early stopping, a run PBT replaced
# by a fork, and an orchestrator that gave up on a run without learning signal (a learning
# rate too high collapses it); a run the trainer found diverged (status `diverged`) is one
# too.
SYSTEM_EVICTIONS = ("asha", "pbt", "orchestrator")


class SweepBenchError(ValueError):
    """A recipe this benchmark cannot compare (no sweep, or no early stopping)."""


@dataclass
class ModeOutcome:
    """One of the two experiments: how long it took, what it spent, whom it picked."""

    mode: str
    run: HeadlessRun
    report: SweepReport
    run_steps: int  # trainer steps summed over every run: the work done
    anytime: list[tuple[float, float]] = field(default_factory=list)  # (s, best so far)
    # run id -> (status, who evicted it, why), from `workbench status`'s reading
    statuses: dict[str, tuple[str, str | None, str | None]] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        """Why this experiment is not a complete sample: a timeout, or runs that neither
        finished nor were evicted by the system's own rules (early stopping, an orchestrator
        giving up on a run without learning signal, as a learning rate too high does, or
        the trainer finding a run diverged). `up` exits 1 for the latter two, so its status
        alone cannot tell."""
        problems = [f"timed out after {self.run.wall_s:.0f} s"] if self.run.timed_out else []
        for run_id, (status, by, reason) in self.statuses.items():
            ended_by_the_sweep = status == "diverged" or (
                status == "evicted" and by in SYSTEM_EVICTIONS
            )
            if status != "finished" and not ended_by_the_sweep:
                problems.append(f"{run_id} {status}" + (f": {reason}" if reason else ""))
        return problems

    def to_json(self) -> dict[str, Any]:
        best = self.report.best
        return {
            "mode": self.mode,
            "command": self.run.command,
            "up_exit_code": self.run.exit_code,
            "timed_out": self.run.timed_out,
            "problems": self.problems,
            "wall_s": round(self.run.wall_s, 1),
            "cpu_s": _rounded(self.run.cpu_s),
            "foreign_cpu_s": _rounded(self.run.foreign_cpu_s),
            "unreaped_processes": self.run.unreaped,
            "run_steps": self.run_steps,
            "winner": None
            if best is None
            else {
                "id": best.id,
                "eval_reward": best.value,
                "eval_step": best.eval_step,
                "differences": best.differences,
                "lineage": best.lineage,
            },
            "runs": [
                {
                    "id": run.id,
                    "rank": run.rank,
                    "eval_reward": run.value,
                    "eval_step": run.eval_step,
                    "step": run.step,
                    "rung": run.rung,
                    "evicted_by_scheduler": run.evicted_by_scheduler,
                    "status": self.statuses.get(run.id, ("unknown", None, None))[0],
                    "evicted_by": self.statuses.get(run.id, ("unknown", None, None))[1],
                    "differences": run.differences,
                    "lineage": run.lineage,
                    "evals": [list(point) for point in run.evals],
                }
                for run in self.report.runs
            ],
            "anytime_best": [[round(s, 1), v] for s, v in self.anytime],
        }


# ---------------------------------------------------------------- the three recipes


def exhaustive_recipe(recipe: Path, directory: Path) -> Path:
    """RECIPE without its `[sweep.scheduler]`, written into `directory`."""
    document, sweep = _scheduled_document(recipe)
    del sweep["scheduler"]
    return _write_variant(document, recipe, directory, "exhaustive")


def pbt_recipe(recipe: Path, directory: Path, max_steps: int | None = None) -> Path:
    """RECIPE with PBT as its `[sweep.scheduler]` (ASHA's metric and mode), judged every
    `pbt_interval` steps, and a checkpoint at each; written into `directory`."""
    import tomlkit

    from workbench.recipe import load_recipe

    loaded = load_recipe(recipe)
    document, sweep = _scheduled_document(recipe)
    old = sweep["scheduler"]
    steps = max_steps or loaded.defaults.max_steps
    interval = pbt_interval(steps, loaded.defaults.eval.interval)
    table = tomlkit.table()
    table.update(
        {
            "kind": "pbt",
            "metric": old.get("metric", "eval_reward_mean"),
            "mode": old.get("mode", "max"),
            "interval": interval,
            "quantile": PBT_QUANTILE,
            "min_runs": old.get("min_runs", 3),
        }
    )
    sweep["scheduler"] = table
    document["defaults"]["checkpoint_interval"] = interval
    return _write_variant(document, recipe, directory, "pbt")


def pbt_interval(max_steps: int, eval_interval: int) -> int:
    """About a quarter of the run, a multiple of the eval interval (at least one of it):
    40 steps with an eval every 5 -> 10 (judged at 10, 20 and 30)."""
    every = max(eval_interval, 1)
    return every * max(1, (max_steps // 4) // every)


def _scheduled_document(recipe: Path) -> tuple[Any, Any]:
    from workbench.config import parse_toml

    document = parse_toml(recipe.read_text(encoding="utf-8"), recipe)
    sweep = document.get("sweep")
    if not isinstance(sweep, dict) or "scheduler" not in sweep:
        raise SweepBenchError(
            f"{recipe}: no [sweep.scheduler] table: there is no early stopping to compare "
            "with running every configuration to max_steps"
        )
    return document, sweep


def _write_variant(document: Any, recipe: Path, directory: Path, mode: str) -> Path:
    experiment = document.get("experiment")
    if isinstance(experiment, dict) and isinstance(experiment.get("name"), str):
        experiment["name"] = f"{experiment['name']}_{mode}"
    path = directory / f"{recipe.stem}_{mode}.toml"
    path.write_text(document.as_string(), encoding="utf-8")
    return path


# ---------------------------------------------------------------- comparing


def compare(scheduled: dict[str, Any], exhaustive: dict[str, Any]) -> dict[str, Any]:
    """A scheduler's outcome and the exhaustive one (`ModeOutcome.to_json`) side by side,
    and the target check."""
    asha = scheduled  # ASHA's, or PBT's
    asha_best, full_best = asha["winner"], exhaustive["winner"]
    comparison: dict[str, Any] = {
        "wall_ratio": _ratio(asha["wall_s"], exhaustive["wall_s"]),
        "cpu_ratio": _ratio(asha["cpu_s"], exhaustive["cpu_s"]),
        "run_steps_ratio": _ratio(asha["run_steps"], exhaustive["run_steps"]),
        "same_configuration": None,
        "exhaustive_tied_winners": [],
        "winner_gap": None,
        "regret_of_pick": None,
        "target": {
            "reward_tolerance": REWARD_TOLERANCE,
            "wall_ratio_at_most": WALL_RATIO_TARGET,
        },
    }
    if asha_best is None or full_best is None:
        comparison["target"]["met"] = False
        comparison["target"]["why"] = "a mode named no winner (no eval records)"
        return comparison
    # Both experiments expand the same [sweep]: a run id is one configuration in both.
    comparison["same_configuration"] = asha_best["id"] == full_best["id"]
    # A held-out eval of few prompts saturates: several configurations may share the top
    # value, and then "the same configuration" is down to the report's tie-break.
    comparison["exhaustive_tied_winners"] = [
        r["id"] for r in exhaustive["runs"] if r["eval_reward"] == full_best["eval_reward"]
    ]
    gap = full_best["eval_reward"] - asha_best["eval_reward"]
    comparison["winner_gap"] = round(gap, 4)
    pick = next((r for r in exhaustive["runs"] if r["id"] == asha_best["id"]), None)
    if pick is not None and pick["eval_reward"] is not None:
        comparison["regret_of_pick"] = round(full_best["eval_reward"] - pick["eval_reward"], 4)
    within = gap <= REWARD_TOLERANCE
    fast = comparison["wall_ratio"] is not None and comparison["wall_ratio"] <= WALL_RATIO_TARGET
    comparison["target"].update(met=within and fast, reward_within=within, wall_within=fast)
    return comparison


def _scheduler_of(recipe: Any) -> dict[str, Any] | None:
    if recipe.sweep is None or recipe.sweep.scheduler is None:
        return None
    return recipe.sweep.scheduler.model_dump(mode="json")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return round(part / whole, 3)


def anytime_best(experiment: Path, started_at: float, metric: str) -> list[tuple[float, float]]:
    """The best of every run's latest eval at each eval record, in seconds since the launch:
    what `sweep report` would have named as the winner's value at that moment."""
    records = []
    for run in layout.list_run_dirs(experiment):
        for record in read_metrics(run, "eval"):
            value, stamp = record.get(metric), record.get("time")
            if isinstance(value, int | float) and isinstance(stamp, int | float):
                records.append((float(stamp), run.name, float(value)))
    latest: dict[str, float] = {}
    curve = []
    for stamp, run_id, value in sorted(records):
        latest[run_id] = value
        curve.append((stamp - started_at, max(latest.values())))
    return curve


def trained_steps(experiment: Path) -> int:
    """Trainer steps over every run of `experiment` (one metrics record each)."""
    return sum(len(read_metrics(run, "trainer")) for run in layout.list_run_dirs(experiment))


# ---------------------------------------------------------------- running


def run_mode(
    mode: str, recipe: Path, scratch: Path, max_steps: int | None, timeout_s: float
) -> ModeOutcome:
    from workbench.recipe import load_recipe

    output_dir = load_recipe(recipe).output_dir
    experiment = output_dir if output_dir.is_absolute() else scratch / output_dir
    if experiment.exists():
        raise SweepBenchError(f"{experiment} exists already: the benchmark needs a fresh one")
    run = run_up_headless(recipe, scratch, max_steps=max_steps, timeout_s=timeout_s)
    report = build_report(experiment)
    return ModeOutcome(
        mode=mode,
        run=run,
        report=report,
        run_steps=trained_steps(experiment),
        anytime=anytime_best(experiment, run.started_at, report.metric),
        statuses={s.id: (s.status, s.evicted_by, s.reason) for s in run_statuses(experiment)},
    )


def run_sweep_benchmark(
    recipe: Path = DEFAULT_RECIPE,
    quick: bool = False,
    max_steps: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    keep_outputs: bool = False,
) -> dict[str, Any]:
    """Run RECIPE with its early stopping, then without; write the JSON and the plot, print
    a table, return the report (with `summary` rows and `exit_code` for `bench all`)."""
    from workbench.recipe import load_recipe

    if quick and max_steps is None:
        max_steps = QUICK_MAX_STEPS
    recipe = recipe.resolve()
    loaded = load_recipe(recipe)  # a bad recipe fails here, before anything runs
    scratch = Path(tempfile.mkdtemp(prefix="workbench-bench-sweep-"))
    recipes = {
        "asha": recipe,
        "pbt": pbt_recipe(recipe, scratch, max_steps),
        "exhaustive": exhaustive_recipe(recipe, scratch),
    }
    load_before = os.getloadavg()
    outcomes = {}
    for mode in MODES:
        directory = scratch / mode
        directory.mkdir()
        outcomes[mode] = run_mode(mode, recipes[mode], directory, max_steps, timeout_s)
    modes = {mode: outcome.to_json() for mode, outcome in outcomes.items()}
    failed = [mode for mode, outcome in outcomes.items() if outcome.problems]
    report: dict[str, Any] = {
        "recipe": str(recipe),
        "max_steps": max_steps or loaded.defaults.max_steps,
        "slots": loaded.trainer.max_concurrent_runs,
        "runs": len(loaded.run_configs()),
        "scheduler": _scheduler_of(loaded),
        "cpu_s_measured_as": "user + system time of `workbench up` and every descendant, "
        "from getrusage(RUSAGE_CHILDREN) around it, orphans reaped by this process "
        "(a Linux child subreaper)",
        "foreign_cpu_s_measured_as": "the machine's busy CPU time (/proc/stat) over the same "
        "interval minus cpu_s: other processes' work beside the experiment",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "pbt_scheduler": _scheduler_of(load_recipe(recipes["pbt"])),
        "modes": modes,
        "comparison": compare(modes["asha"], modes["exhaustive"]),
        "comparison_pbt": compare(modes["pbt"], modes["exhaustive"]),
        "exit_code": 1 if failed else 0,  # 1: a mode has `problems`
    }
    report["summary"] = summary_rows(report)
    _write_report(report, outcomes, recipe, scratch, keep_outputs)
    print_table(report)
    return report


def _write_report(
    report: dict[str, Any],
    outcomes: dict[str, ModeOutcome],
    recipe: Path,
    scratch: Path,
    keep_outputs: bool,
) -> None:
    """The JSON and the plot of each mode's curves written (the plot also as
    sweep-latest.png), their paths in the report; the scratch directories kept when a mode
    had problems or when asked."""
    from workbench.bench.results import RESULTS_DIR, write_result

    json_path = write_result("sweep", report, results_dir=RESULTS_DIR)
    png = render_comparison(outcomes, title=f"{recipe.stem}: ASHA, PBT and every run to max_steps")
    layout.atomic_write_bytes(json_path.with_suffix(".png"), png)
    layout.atomic_write_bytes(RESULTS_DIR / "sweep-latest.png", png)
    report["path"] = str(json_path)
    report["plot"] = str(RESULTS_DIR / "sweep-latest.png")
    if report["exit_code"] or keep_outputs:
        report["scratch_dir"] = str(scratch)
    else:
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------- showing


def summary_rows(report: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for mode in MODES:
        outcome = report["modes"][mode]
        winner = outcome["winner"]
        picked = "no winner" if winner is None else (
            f"{winner['id']} at {winner['eval_reward']:.3f} (step {winner['eval_step']})"
        )  # fmt: skip
        cpu = "?" if outcome["cpu_s"] is None else f"{outcome['cpu_s']:.0f}"
        if outcome["problems"]:
            picked += "; not a complete sample: " + "; ".join(outcome["problems"])
        rows.append(
            {
                "metric": f"sweep {mode}: wall, CPU-seconds, trainer steps, winner",
                "value": f"{outcome['wall_s']:.0f} s, {cpu} CPU-s, {outcome['run_steps']} "
                f"steps, {picked}",
            }
        )
    for mode, key in (("ASHA", "comparison"), ("PBT", "comparison_pbt")):
        comparison = report.get(key)
        if comparison is None:
            continue
        target = comparison["target"]
        rows.append(
            {
                "metric": f"sweep: {mode} / exhaustive wall, CPU; winner gap; same pick; target",
                "value": f"{comparison['wall_ratio']}x, {comparison['cpu_ratio']}x; "
                f"{comparison['winner_gap']}; {comparison['same_configuration']}; "
                + ("met" if target["met"] else "missed"),
            }
        )
    return rows


def print_table(report: dict[str, Any]) -> None:
    from rich.table import Table

    from workbench.system.console import output_console

    table = Table(title=f"sweep: {report['recipe']} ({report['runs']} runs, {report['slots']} "
                  f"slots, {report['max_steps']} steps)")  # fmt: skip
    for column in ("mode", "wall s", "CPU-s", "trainer steps", "winner", "eval reward"):
        table.add_column(column)
    for mode in MODES:
        outcome = report["modes"][mode]
        winner = outcome["winner"] or {}
        table.add_row(
            mode,
            f"{outcome['wall_s']:.0f}",
            "?" if outcome["cpu_s"] is None else f"{outcome['cpu_s']:.0f}",
            str(outcome["run_steps"]),
            winner.get("id", "-"),
            "-" if not winner else f"{winner['eval_reward']:.3f} @ {winner['eval_step']}",
        )
    console = output_console()  # tables whole when piped or logged
    console.print(table)
    for row in report["summary"][len(MODES) :]:
        console.print(f"{row['metric']}: {row['value']}", highlight=False)
    console.print(f"plot: {report['plot']}", highlight=False)
    if "scratch_dir" in report:
        console.print(f"experiment directories kept: {report['scratch_dir']}", highlight=False)


def render_comparison(outcomes: dict[str, ModeOutcome], title: str) -> bytes:
    """Each mode's eval curves by step, and the best-so-far eval reward against wall time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from workbench.curves import draw_panel, run_colours
    from workbench.sweep.report import eval_panel

    modes = [mode for mode in MODES if mode in outcomes]
    figure = Figure(figsize=(6 * (len(modes) + 1), 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(modes) + 1)
    panels = [eval_panel(outcomes[mode].report, title=f"{mode}: eval by step") for mode in modes]
    # The same run in both modes keeps its colour.
    colours = run_colours([line.run_id for panel in panels for line in panel.lines])
    for index, panel in enumerate(panels):
        if draw_panel(axes[index], panel, colours):
            axes[index].legend(fontsize="small", loc="best")
    anytime = axes[len(modes)]
    for mode in modes:
        outcome = outcomes[mode]
        if outcome.anytime:
            seconds, values = zip(*outcome.anytime, strict=True)
            (line,) = anytime.step(seconds, values, where="post", label=mode)
            anytime.axvline(outcome.run.wall_s, color=line.get_color(), linestyle=":")
    anytime.set_xlabel("wall-clock seconds since `workbench up` (dotted: the end)")
    anytime.set_ylabel("best eval reward so far")
    anytime.set_title("the winner's value over time")
    anytime.grid(alpha=0.3)
    if anytime.lines:
        anytime.legend(loc="lower right")
    figure.suptitle(title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()
