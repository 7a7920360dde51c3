"""`workbench bench e2e`: reward vs wall-clock time for a recipe, run for real.

`workbench up RECIPE --headless` (optionally `--max-steps N`) runs in a scratch working
directory, so the experiment's outputs land there and not in the repository; the clock
starts just before it is launched, so the curves include everything a user waits for
(vLLM and trainer startup, model cache lookup). Once it exits, every run's `metrics.jsonl`
is read: each orchestrator line (step, reward_mean, time) is one point of that run's curve,
at `time` minus the start. A batch the orchestrator dropped for lack of learning signal is
still a sample of the policy's reward, so it stays on the curve. Eval lines (held-out
reward of a policy version) are reported beside the curve: their reward, how long each eval
took and how long steps waited for one.

Per run it reports the mean reward of the first 5 and last 5 points, steps per minute once
the run's first step is in (steady state, without startup), the time to the first step and
the wall time to the last. Results: `benchmarks/results/e2e-*.json` and a PNG of the
curves (`e2e-latest.png` beside the JSON).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.bench.headless import run_up_headless
from workbench.files import layout

DEFAULT_RECIPE = Path("recipes/reverse_text.toml")
# Far above what the reverse_text recipe takes on 2 CPU cores (about 2 minutes); a hung
# experiment is then stopped (as Ctrl-C would) instead of holding the benchmark suite forever.
DEFAULT_TIMEOUT_S = 3 * 3600.0
WINDOW = 5  # points averaged at each end of a curve
# `bench all --quick`: enough steps for both 5-step windows to be distinct.
QUICK_MAX_STEPS = 10


@dataclass(frozen=True)
class CurvePoint:
    seconds: float  # since the benchmark launched `workbench up`
    step: int
    reward_mean: float
    policy_version: int | None  # as the orchestrator recorded it; None if it did not


@dataclass(frozen=True)
class EvalPoint:
    seconds: float  # when the eval's line was written, since the launch
    policy_version: int
    reward_mean: float
    eval_s: float


@dataclass
class RunCurve:
    run_id: str
    points: list[CurvePoint]
    evals: list[EvalPoint] = field(default_factory=list)
    eval_wait_s: float = 0.0  # summed over steps: waits for an eval still running

    def summary(self) -> dict[str, Any]:
        """First-5 vs last-5 mean reward, steps/min after the first step, times and evals."""
        if not self.points:
            return {"run_id": self.run_id, "points": 0}
        return {**self._reward_summary(), **self._eval_summary()}

    def _eval_summary(self) -> dict[str, Any]:
        if not self.evals:
            return {"evals": 0}
        return {
            "evals": len(self.evals),
            "eval_reward_first": round(self.evals[0].reward_mean, 4),
            "eval_reward_last": round(self.evals[-1].reward_mean, 4),
            "eval_s_median": round(statistics.median(e.eval_s for e in self.evals), 3),
            "eval_wait_s_total": round(self.eval_wait_s, 3),
        }

    def _reward_summary(self) -> dict[str, Any]:
        rewards = [p.reward_mean for p in self.points]
        first, last = self.points[0], self.points[-1]
        steady_s = last.seconds - first.seconds
        steps_done = last.step - first.step
        first_mean = statistics.fmean(rewards[:WINDOW])
        last_mean = statistics.fmean(rewards[-WINDOW:])
        return {
            "run_id": self.run_id,
            "points": len(self.points),
            "steps": len({p.step for p in self.points}),
            "last_step": last.step,
            "reward_first5_mean": round(first_mean, 4),
            "reward_last5_mean": round(last_mean, 4),
            "reward_gain": round(last_mean - first_mean, 4),
            "steps_per_min": round(steps_done / steady_s * 60, 2) if steady_s > 0 else None,
            "first_step_s": round(first.seconds, 1),
            "wall_s": round(last.seconds, 1),
        }


def read_curves(experiment: Path, started_at: float) -> list[RunCurve]:
    """Every run's orchestrator reward curve, in seconds since `started_at` (unix time)."""
    from workbench.files.metrics import read_metrics

    curves = []
    for run in layout.list_run_dirs(experiment):
        records = timed(read_metrics(run, source="orchestrator"), "reward_mean")
        points = [
            CurvePoint(
                seconds=round(r["time"] - started_at, 3),
                step=int(r["step"]),
                reward_mean=float(r["reward_mean"]),
                policy_version=r.get("policy_version"),
            )
            for r in records
        ]
        evals = [
            EvalPoint(
                seconds=round(r["time"] - started_at, 3),
                policy_version=int(r.get("policy_version", r["step"])),
                reward_mean=float(r["eval_reward_mean"]),
                eval_s=float(r.get("eval_s", 0.0)),
            )
            for r in timed(read_metrics(run, source="eval"), "eval_reward_mean")
        ]
        waited = sum(float(r.get("eval_wait_s") or 0.0) for r in records)
        curves.append(RunCurve(run.name, points, evals, eval_wait_s=waited))
    return curves


def timed(records: list[dict[str, Any]], value_key: str) -> list[dict[str, Any]]:
    """The records with a numeric `value_key` and `time`, by time."""
    usable = [
        r
        for r in records
        if isinstance(r.get(value_key), int | float) and isinstance(r.get("time"), int | float)
    ]
    return sorted(usable, key=lambda r: r["time"])


def plot_curves(curves: list[RunCurve], path: Path, title: str) -> Path:
    """Reward vs wall-clock, one colour per run (its evals dashed), as a PNG written
    atomically to `path`."""
    from workbench.curves import Line, Panel, draw, image_bytes

    lines = []
    for curve in curves:
        if not curve.points:
            continue
        lines.append(Line(curve.run_id, [(p.seconds, p.reward_mean) for p in curve.points]))
        if curve.evals:
            evals = [(e.seconds, e.reward_mean) for e in curve.evals]
            lines.append(
                Line(curve.run_id, evals, label=f"{curve.run_id} eval (held-out)", dashed=True)
            )
    panel = Panel(
        "mean reward of the step's batch",
        lines,
        markers=True,
        xlabel="wall-clock seconds since `workbench up`",
        ylim=(0, 1),
    )
    layout.atomic_write_bytes(path, image_bytes(draw([panel], title)))
    return path


def write_e2e_report(
    experiment: Path,
    started_at: float,
    *,
    recipe: Path,
    details: dict[str, Any] | None = None,
    results_dir: Path | None = None,
) -> dict[str, Any]:
    """Read the curves of `experiment`, write the JSON and the PNG, return the report.

    `details` (command, exit code, load average, ...) is stored as given.
    """
    from workbench.bench.results import RESULTS_DIR, write_result

    results_dir = RESULTS_DIR if results_dir is None else results_dir
    curves = read_curves(experiment, started_at)
    runs = [curve.summary() for curve in curves]
    report: dict[str, Any] = {
        "recipe": str(recipe),
        **(details or {}),
        "runs": runs,
        "curves": {
            curve.run_id: [
                [p.seconds, p.step, p.reward_mean, p.policy_version] for p in curve.points
            ]
            for curve in curves
        },
        "curve_columns": ["seconds", "step", "reward_mean", "policy_version"],
        "evals": {
            curve.run_id: [
                [e.seconds, e.policy_version, e.reward_mean, e.eval_s] for e in curve.evals
            ]
            for curve in curves
        },
        "eval_columns": ["seconds", "policy_version", "eval_reward_mean", "eval_s"],
    }
    report["summary"] = summary_rows(runs)
    json_path = write_result("e2e", report, results_dir=results_dir)
    title = f"{recipe.stem}: reward vs wall-clock"
    plot_curves(curves, json_path.with_suffix(".png"), title)
    png_path = plot_curves(curves, results_dir / "e2e-latest.png", title)
    report["path"] = str(json_path)
    report["plot"] = str(png_path)
    return report


def summary_rows(runs: list[dict[str, Any]]) -> list[dict[str, str]]:
    rows = []
    for run in runs:
        if not run.get("points"):
            rows.append({"metric": f"e2e {run['run_id']}", "value": "no steps"})
            continue
        rows.append(
            {
                "metric": f"e2e {run['run_id']}: reward first 5 -> last 5",
                "value": f"{run['reward_first5_mean']:.3f} -> {run['reward_last5_mean']:.3f}",
            }
        )
        rows.append(
            {
                "metric": f"e2e {run['run_id']}: steps/min, wall time",
                "value": f"{run['steps_per_min']} steps/min, {run['wall_s']:.0f} s",
            }
        )
        if run.get("evals"):
            rows.append(
                {
                    "metric": f"e2e {run['run_id']}: held-out reward first -> last eval",
                    "value": f"{run['eval_reward_first']:.3f} -> {run['eval_reward_last']:.3f} "
                    f"({run['evals']} evals, {run['eval_s_median']:.2f} s each, steps waited "
                    f"{run['eval_wait_s_total']:.2f} s)",
                }
            )
    return rows


def run_e2e_benchmark(
    recipe: Path = DEFAULT_RECIPE,
    max_steps: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    quick: bool = False,
    keep_outputs: bool = False,
) -> dict[str, Any]:
    """Run RECIPE headless in a scratch directory, then report and plot its reward curves.

    `quick` (from `bench all --quick`) caps every run at `QUICK_MAX_STEPS` steps unless
    `max_steps` is given. The scratch directory is removed when the experiment finished
    cleanly, unless `keep_outputs`, and kept (its path is in the report) otherwise, for its
    logs.
    """
    from workbench.recipe import load_recipe

    if quick and max_steps is None:
        max_steps = QUICK_MAX_STEPS
    recipe = recipe.resolve()
    output_dir = load_recipe(recipe).output_dir
    scratch = Path(tempfile.mkdtemp(prefix="workbench-bench-e2e-"))
    experiment = output_dir if output_dir.is_absolute() else scratch / output_dir

    load_before = os.getloadavg()
    run = run_up_headless(recipe, scratch, max_steps=max_steps, timeout_s=timeout_s)
    exit_code, timed_out = run.exit_code, run.timed_out
    details = {
        "command": run.command,
        "max_steps": max_steps,
        "exit_code": exit_code,
        "timed_out": timed_out,
        "total_wall_s": round(run.wall_s, 1),
        "cpu_s": None if run.cpu_s is None else round(run.cpu_s, 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    report = write_e2e_report(experiment, run.started_at, recipe=recipe, details=details)
    if exit_code == 0 and not timed_out and not keep_outputs:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        report["scratch_dir"] = str(scratch)
    print_table(report)
    return report


def print_table(report: dict[str, Any]) -> None:
    from rich.table import Table

    from workbench.system.console import output_console

    table = Table(title=f"end to end: {report['recipe']}")
    table.add_column("run")
    table.add_column("steps", justify="right")
    table.add_column("reward first 5", justify="right")
    table.add_column("reward last 5", justify="right")
    table.add_column("steps/min", justify="right")
    table.add_column("first step s", justify="right")
    table.add_column("wall s", justify="right")
    table.add_column("held-out reward", justify="right")
    for run in report["runs"]:
        if not run.get("points"):
            table.add_row(run["run_id"], "0", "-", "-", "-", "-", "-", "-")
            continue
        held_out = "-"
        if run.get("evals"):
            held_out = f"{run['eval_reward_first']:.3f} -> {run['eval_reward_last']:.3f}"
        table.add_row(
            run["run_id"],
            str(run["steps"]),
            f"{run['reward_first5_mean']:.3f}",
            f"{run['reward_last5_mean']:.3f}",
            str(run["steps_per_min"]),
            f"{run['first_step_s']:.0f}",
            f"{run['wall_s']:.0f}",
            held_out,
        )
    console = output_console()  # tables whole when piped or logged
    console.print(table)
    extra = ""
    if "total_wall_s" in report:
        extra = (
            f"`up` exited {report['exit_code']} after {report['total_wall_s']:.0f} s, load "
            f"average {report['load_average_before'][0]:.2f} before / "
            f"{report['load_average_after'][0]:.2f} after; "
        )
    console.print(f"{extra}plot: {report['plot']}", highlight=False)
    if "scratch_dir" in report:
        console.print(f"experiment directory kept: {report['scratch_dir']}", highlight=False)
