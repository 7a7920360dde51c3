"""`workbench bench e2e --vs separate`: N runs as one experiment against N experiments.

The claim workbench makes: N runs sharing one vLLM server and one trainer cost far less
than N experiments of one run each. The same N runs (the recipe's model, task and settings;
learning rates 1e-3, 2e-3, 3e-3, 5e-3, then 4e-3, 6e-3, 7e-3, 8e-3) go three ways, one
after the other, each `workbench up --headless` in its own scratch directory:

- `shared`: one experiment holding the N runs;
- `one_after_another`: N experiments of one run each, each started when the previous ended;
- `at_once`: the N experiments started together, when memory allows: each is expected to
  need the peak RSS its process tree reached in `one_after_another`, and N of them must
  fit in 85 % of what /proc/meminfo calls available just before; otherwise the result says
  so and nothing is started.

Every setup has the same `[inference]` and `[trainer]` (slots and adapters enough for N),
so a run's settings are the same everywhere. Per setup: wall time (launch to exit, vLLM's
start included), run-steps per hour (trainer steps over every run), CPU-seconds of the
whole process trees (the kernel's exact sum, `headless.run_accounted`) and by role (vLLM,
trainer, orchestrators, supervisor: `process_trees`, sampled), the peak of the trees' RSS
summed, each run's time to its first and last step, and where the time went (`busy`: the
trainer's, the orchestrators' and vLLM's shares busy, waiting and starting, over the
whole run). The speedups are the separate setups' wall time over the shared one's.

Each run's curve (reward_mean and policy version of every orchestrator step) must be the
same in every setup. Bit for bit it need not be: packed beside other runs, a run's tokens
go through matmuls of other shapes than alone, so its adapter differs in the last bits, and
sooner or later one sampled token differs. So the result says whether the curves are
identical, or from which step they drift and by how much. A step that sampled with the
same adapter version and is more than `CURVE_TOLERANCE` off splits the run: the seed
control (`workbench.bench.seed_control`) then trains it alone under other seeds, and the
benchmark fails if its shared outcome lies outside what it does alone. A step sampled with
another adapter when `async_level = 0` fails it. Above 0, timing may pick which adapter a
step samples with: from the first step that did, the curves are not compared.

Results: `benchmarks/results/e2e-separate-*.json` and `e2e-separate-latest.png`.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path
from typing import Any

from workbench.bench.separate_setup import (
    CURVE_TOLERANCE,
    DEFAULT_MAX_STEPS,
    DEFAULT_RECIPE,
    DEFAULT_RUNS,
    DEFAULT_TIMEOUT_S,
    LEARNING_RATES,
    MEMORY_HEADROOM,
    QUICK_MAX_STEPS,
    QUICK_RUNS,
    SETUPS,
    Experiment,
    run_setup,
    write_recipes,
)
from workbench.files import busy, layout


def at_once_plan(one_after_another: dict[str, Any], available_bytes: int | None) -> str | None:
    """Why the experiments cannot run at once (None if they fit): each needs the peak RSS
    one of them reached alone."""
    peaks = [e["peak_rss_mb"] for e in one_after_another["per_experiment"]]
    if not peaks or available_bytes is None:
        return "no memory figures to plan with"
    needed_mb = max(peaks) * len(peaks)
    usable_mb = available_bytes / 2**20 * MEMORY_HEADROOM
    if needed_mb > usable_mb:
        return (
            f"does not fit: {len(peaks)} x {max(peaks)} MB (one experiment's peak RSS) = "
            f"{needed_mb} MB, more than {MEMORY_HEADROOM:.0%} of the {available_bytes / 2**20:.0f} "
            "MB available"
        )
    return None


# ---------------------------------------------------------------- comparing


def compare_curves(setups: dict[str, dict[str, Any]], async_level: int) -> dict[str, Any]:
    """Each run's curve in every setup against the shared one (see the module docstring).

    `identical`: every step the same. Otherwise `drift` lists each run's first step that
    differs (same adapter version, a reward a little off) and `max_drift` the largest gap
    within the tolerance. A step that sampled with the same adapter and is more than
    `CURVE_TOLERANCE` off is a split (`splits`, its runs in `split_runs`): the seed control
    judges it. A missing step, or another adapter when `async_level = 0`, is a failure.
    """
    reference = setups["shared"]["runs"]
    failures, splits, timing, drift = [], [], [], []
    split_runs: set[str] = set()
    max_drift = 0.0
    for setup, result in setups.items():
        if setup == "shared" or "runs" not in result:
            continue
        for run_id, ref in reference.items():
            other = result["runs"].get(run_id, {}).get("curve", [])
            if len(other) != len(ref["curve"]):
                failures.append(
                    f"{run_id} in {setup}: {len(other)} steps, shared {len(ref['curve'])}"
                )
            drifted = False
            for mine, theirs in zip(ref["curve"], other, strict=False):
                if mine == theirs:
                    continue
                where = f"{run_id} step {mine[0]} in {setup}: shared {mine[1:]} vs {theirs[1:]}"
                if mine[2] != theirs[2]:
                    if async_level > 0:
                        timing.append(where + " (sampled with another adapter: not compared on)")
                    else:
                        failures.append(where + " (sampled with another adapter)")
                    break
                gap = abs(mine[1] - theirs[1])
                if gap > CURVE_TOLERANCE:
                    splits.append(where)
                    split_runs.add(run_id)
                    break
                if not drifted:
                    drift.append(where)
                    drifted = True
                max_drift = max(max_drift, gap)
    return {
        "identical": not (failures or splits or timing or drift),
        "failures": failures,
        "splits": splits,
        "split_runs": sorted(split_runs),
        "timing": timing,
        "drift": drift,
        "max_drift": max_drift,
    }


def speedups(setups: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    shared = setups["shared"]["wall_s"]
    return {
        setup: round(result["wall_s"] / shared, 2) if "wall_s" in result and shared else None
        for setup, result in setups.items()
        if setup != "shared"
    }


# ---------------------------------------------------------------- the benchmark


def _run_setups(
    experiments: dict[str, list[Experiment]],
    max_steps: int,
    timeout_s: float,
    at_once: bool,
    separate: bool = True,
) -> dict[str, dict[str, Any]]:
    """The shared experiment, then (unless not `separate`) the separate ones one after
    another, then (when asked and memory allows) at once, each setup's result by name."""
    from workbench.system.procfs import memory_available_bytes

    setups: dict[str, dict[str, Any]] = {}
    common = {"max_steps": max_steps, "timeout_s": timeout_s}
    setups["shared"] = run_setup("shared", experiments["shared"], **common)
    if not separate:
        why = "not asked (--no-separate)"
        return {"shared": setups["shared"]} | {name: {"setup": name, "skipped": why}
                                               for name in SETUPS[1:]}  # fmt: skip
    setups["one_after_another"] = run_setup("one_after_another", experiments["separate"], **common)
    available = memory_available_bytes()
    why_not = at_once_plan(setups["one_after_another"], available) if at_once else "not asked"
    if why_not is None:
        for experiment in experiments["separate"]:
            shutil.rmtree(experiment.directory, ignore_errors=True)  # a fresh experiment each
        setups["at_once"] = run_setup("at_once", experiments["separate"], **common)
    else:
        setups["at_once"] = {"setup": "at_once", "skipped": why_not}
    setups["at_once"]["memory_available_mb"] = (
        None if available is None else round(available / 2**20)
    )
    return setups


def run_separate_benchmark(
    recipe: Path = DEFAULT_RECIPE,
    runs: int = DEFAULT_RUNS,
    max_steps: int | None = None,
    quick: bool = False,
    at_once: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    keep_outputs: bool = False,
    separate: bool = True,
    seed_control: bool = True,
) -> dict[str, Any]:
    """Every setup in turn, then the comparison (and the seed control of any split run),
    JSON, plot and table; `exit_code` 1 when a setup had problems, a curve differs, or a
    split run ends outside what it does alone under other seeds."""
    from workbench.recipe import load_recipe

    if quick:
        runs, max_steps = min(runs, QUICK_RUNS), max_steps or QUICK_MAX_STEPS
    max_steps = max_steps or DEFAULT_MAX_STEPS
    recipe = recipe.resolve()
    loaded = load_recipe(recipe)  # a bad recipe fails here, before anything runs
    scratch = Path(tempfile.mkdtemp(prefix="workbench-bench-separate-"))
    experiments = write_recipes(recipe, runs, scratch)
    setups = _run_setups(experiments, max_steps, timeout_s, at_once, separate)
    curves = compare_curves(setups, loaded.defaults.async_level)
    problems = [p for result in setups.values() for p in result.get("problems", [])]
    if curves["split_runs"] and seed_control:
        from workbench.bench.seed_control import run_seed_control

        curves["seed_control"] = run_seed_control(
            recipe, curves["split_runs"], setups, run_seed=loaded.defaults.seed, slots=runs,
            scratch=scratch, max_steps=max_steps, timeout_s=timeout_s,
        )  # fmt: skip
        problems += curves["seed_control"]["problems"]
    report: dict[str, Any] = {
        "recipe": str(recipe),
        "runs": runs,
        "learning_rates": list(LEARNING_RATES[:runs]),
        "max_steps": max_steps,
        "async_level": loaded.defaults.async_level,
        "setups": setups,
        "speedup": speedups(setups),
        "curves": curves,
        "cpu_s_measured_as": "user + system time of every `workbench up` and its descendants "
        "(getrusage(RUSAGE_CHILDREN), orphans reaped by this process); by role: each "
        "process's own time as last sampled from /proc (twice a second)",
        "peak_rss_measured_as": "the largest sum of the RSS of every process of the setup's "
        "trees at one sample (shared pages count once per process)",
        "exit_code": 1 if problems or not curves_pass(curves) else 0,
    }
    report["summary"] = summary_rows(report)
    _write_report(report, scratch, keep_outputs)
    print_table(report)
    return report


def _write_report(report: dict[str, Any], scratch: Path, keep_outputs: bool) -> None:
    """The JSON and its plot written (the plot also as e2e-separate-latest.png), their paths
    in the report; the scratch directory kept when the benchmark failed or when asked."""
    from workbench.bench.results import RESULTS_DIR, write_result

    json_path = write_result("e2e-separate", report, results_dir=RESULTS_DIR)
    png = render(report)
    layout.atomic_write_bytes(json_path.with_suffix(".png"), png)
    layout.atomic_write_bytes(RESULTS_DIR / "e2e-separate-latest.png", png)
    report["path"] = str(json_path)
    report["plot"] = str(RESULTS_DIR / "e2e-separate-latest.png")
    if report["exit_code"] or keep_outputs:
        report["scratch_dir"] = str(scratch)
    else:
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------- showing


def _share(result: dict[str, Any], part: str, kind: str) -> str:
    value = result.get("time_breakdown", {}).get(part, {}).get(kind)
    return "-" if value is None else f"{value:.0%}"


def summary_rows(report: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    n = report["runs"]
    for setup in SETUPS:
        result = report["setups"][setup]
        if "skipped" in result:
            rows.append(
                {"metric": f"e2e separate {setup}", "value": f"skipped: {result['skipped']}"}
            )
            continue
        rows.append(
            {
                "metric": f"e2e separate {setup} ({n} runs): wall, run-steps/h, CPU-s, peak RSS",
                "value": f"{result['wall_s']:.0f} s, {result['run_steps_per_hour']:.0f}, "
                f"{result['cpu_s']} CPU-s, {result['peak_rss_mb']} MB",
            }
        )
        rows.append(
            {
                "metric": f"e2e separate {setup}: busy trainer / orchestrators / vLLM",
                "value": " / ".join(
                    _share(result, part, busy.BUSY)
                    for part in ("trainer", "orchestrators", busy.INFERENCE)
                ),
            }
        )
    speedup = ", ".join(
        f"{setup} {ratio}x" if ratio is not None else f"{setup} not run"
        for setup, ratio in report["speedup"].items()
    )
    rows.append({"metric": "e2e separate: speedup (separate wall / shared wall)", "value": speedup})
    curves = report["curves"]
    rows.append(
        {"metric": "e2e separate: every run's curve in every setup", "value": verdict_of(curves)}
    )
    return rows


def curves_pass(curves: dict[str, Any]) -> bool:
    """No failure, and every split run within what it does alone under other seeds."""
    from workbench.bench.seed_control import explained

    return not curves["failures"] and explained(curves)


def verdict_of(curves: dict[str, Any]) -> str:
    """The curves' comparison in a line: identical, within the tolerance, split but within
    the seed control's spread, or different."""
    from workbench.bench.seed_control import describe

    control = curves.get("seed_control")
    if not curves_pass(curves):
        said = "DIFFERENT: " + "; ".join(curves["failures"] + curves["splits"] + curves["timing"])
        if control:
            said += f"; seed control: {describe(control)}"
        elif curves["splits"]:
            said += "; no seed control run (--no-seed-control)"
        return said
    if curves["identical"]:
        return "identical"
    said = []
    if curves["splits"]:
        said.append(
            f"{len(curves['split_runs'])} split past {CURVE_TOLERANCE} and end where they do "
            f"alone ({'; '.join(curves['splits'])}; seed control: {describe(control)})"  # type: ignore[arg-type]
        )
    said.append(
        f"{'the others' if said else 'every run'} within {CURVE_TOLERANCE} of the shared curves"
    )
    if curves["drift"]:
        said.append(
            f"largest gap {curves['max_drift']:.4f} from the first step that differs: "
            + "; ".join(curves["drift"])
        )
    return ", ".join(said) + "".join(f"; {line}" for line in curves["timing"])


def print_table(report: dict[str, Any]) -> None:
    from rich.table import Table

    from workbench.system.console import output_console

    table = Table(
        title=f"{report['runs']} runs x {report['max_steps']} steps: one experiment vs separate"
    )
    columns = ("setup", "wall s", "speedup", "run-steps/h", "CPU-s", "peak RSS MB",
               "first step s", "last step s", "trainer busy", "orch. waiting", "vLLM busy")  # fmt: skip
    for column in columns:
        table.add_column(column)
    for setup in SETUPS:
        result = report["setups"][setup]
        if "skipped" in result:
            table.add_row(setup, "skipped", *[""] * (len(columns) - 2))
            continue
        firsts = [r["first_step_s"] for r in result["runs"].values() if r["first_step_s"]]
        lasts = [r["last_step_s"] for r in result["runs"].values() if r["last_step_s"]]
        table.add_row(
            setup,
            f"{result['wall_s']:.0f}",
            "1.00" if setup == "shared" else f"{report['speedup'].get(setup)}",
            f"{result['run_steps_per_hour']:.0f}",
            str(result["cpu_s"]),
            str(result["peak_rss_mb"]),
            f"{min(firsts):.0f}-{max(firsts):.0f}" if firsts else "-",
            f"{min(lasts):.0f}-{max(lasts):.0f}" if lasts else "-",
            _share(result, "trainer", busy.BUSY),
            _share(result, "orchestrators", busy.WAITING),
            _share(result, busy.INFERENCE, busy.BUSY),
        )
    console = output_console()  # tables whole when piped or logged
    console.print(table)
    for row in report["summary"][-2:]:
        console.print(f"{row['metric']}: {row['value']}", highlight=False)
    skipped = report["setups"]["at_once"].get("skipped")
    if skipped:
        console.print(f"at once: {skipped}", highlight=False)
    console.print(f"plot: {report['plot']}", highlight=False)
    if "scratch_dir" in report:
        console.print(f"experiment directories kept: {report['scratch_dir']}", highlight=False)


def render(report: dict[str, Any]) -> bytes:
    """Wall time per setup; every run's reward by step in each setup (the lines should lie
    on one another); where each setup's time went."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    setups = {name: r for name, r in report["setups"].items() if "skipped" not in r}
    figure = Figure(figsize=(18, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    walls, curves, breakdown = figure.subplots(1, 3)

    _draw_wall_times(walls, report, setups)
    _draw_curves(curves, setups, report["curves"].get("seed_control"))
    _draw_time_breakdown(breakdown, setups)
    figure.suptitle(f"{Path(report['recipe']).stem}: one experiment vs separate experiments")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def _draw_wall_times(walls: Any, report: dict[str, Any], setups: dict[str, Any]) -> None:
    names = list(setups)
    bars = walls.bar(names, [setups[n]["wall_s"] for n in names], color="tab:blue")
    for bar, name in zip(bars, names, strict=True):
        ratio = report["speedup"].get(name, 1.0)
        walls.annotate(f"{setups[name]['wall_s']:.0f} s ({ratio}x)",
                       (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                       ha="center", va="bottom")  # fmt: skip
    walls.set_ylabel("wall seconds, launch to exit")
    walls.set_title(f"{report['runs']} runs x {report['max_steps']} steps")


LEGEND_MAX_RUNS = 10  # more runs' names hide the curves: then only the split runs'


def _draw_curves(curves: Any, setups: dict[str, Any], control: dict[str, Any] | None) -> None:
    from workbench.bench.seed_control import split_run_of
    from workbench.curves import run_colours

    run_ids = sorted({run_id for r in setups.values() for run_id in r["runs"]})
    colours = run_colours(run_ids)
    control_curves = (control or {}).get("curves", {})
    named = {split_run_of(run_id) for run_id in control_curves}
    if len(run_ids) <= LEGEND_MAX_RUNS:
        named = set(run_ids)
    for run_id, curve in control_curves.items():
        split_run = split_run_of(run_id)
        points = [(step, reward) for step, reward, _ in curve]
        if points and split_run in colours:
            steps, rewards = zip(*points, strict=True)
            curves.plot(steps, rewards, "-.", color=colours[split_run], linewidth=0.8)
    styles = {"shared": "-", "one_after_another": "--", "at_once": ":"}
    for name, result in setups.items():
        for run_id, run in result["runs"].items():
            points = [(step, reward) for step, reward, _ in run["curve"]]
            if points:
                steps, rewards = zip(*points, strict=True)
                label = run_id if name == "shared" and run_id in named else None
                curves.plot(
                    steps, rewards, styles.get(name, "-"), color=colours[run_id], label=label
                )
    curves.set_xlabel(
        "step (solid: shared; dashed: one after another; dotted: at once;\n"
        "dash-dot: a split run alone under another seed)"
    )
    curves.set_ylabel("mean reward of the step's batch")
    curves.set_title("every run's curve in every setup")
    if any(line.get_label() in named for line in curves.lines):
        curves.legend(fontsize="small")


def _draw_time_breakdown(breakdown: Any, setups: dict[str, Any]) -> None:
    names = list(setups)
    parts = ("trainer", "orchestrators", busy.INFERENCE)
    labels, lefts = [], []
    kinds = ((busy.BUSY, "tab:green"), (busy.WAITING, "tab:orange"), (busy.STARTING, "tab:gray"))
    for name in names:
        for part in parts:
            labels.append(f"{name}: {part}")
            lefts.append(setups[name]["time_breakdown"].get(part, {}))
    positions = range(len(labels))
    offset = [0.0] * len(labels)
    for kind, colour in kinds:
        widths = [shares.get(kind, 0.0) for shares in lefts]
        breakdown.barh(positions, widths, left=offset, color=colour, label=kind)
        offset = [a + b for a, b in zip(offset, widths, strict=True)]
    breakdown.set_yticks(list(positions), labels, fontsize="small")
    breakdown.invert_yaxis()
    breakdown.set_xlim(0, 1)
    breakdown.set_xlabel("share of each process's wall time")
    breakdown.set_title("where the time went")
    breakdown.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize="small")
