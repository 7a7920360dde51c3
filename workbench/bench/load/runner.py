"""One load benchmark, from `up` to `down`, and its report.

1. `workbench up --headless --detach` on the load recipe (`churn.load_recipe`) in a scratch
   directory; wait until the trainer holds all its slots (4 by default).
2. Attach the TUI (headless, in this process) and, for `duration_s`, churn runs while
   pressing keys in the TUI and timing them (`keys`); every 2 s, note the slot problems of
   the moment (how long a freed slot stays unused is a figure, not a failure). The churn
   and the slot watch run in a child process (`background`): this process is the TUI's
   alone, as a user's is.
3. Stop the churn; give the trainer up to `SETTLE_TIMEOUT_S` to catch up, then check
   (`checks`): slots, lost runs, metrics, crashes, and listeners (the faults benchmark's
   security check). Then `workbench down`, and count processes left and half-written files.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from workbench.bench.faults import invariants
from workbench.bench.faults.experiment import FaultExperiment
from workbench.bench.faults.security import listening_problems
from workbench.bench.load import checks, stalls
from workbench.bench.load.background import BackgroundLoad
from workbench.bench.load.churn import (
    RUN_SETTINGS,
    RUNS_AT_ONCE,
    SHIPPED_RECIPE,
    SLOTS,
    ChurnLog,
    load_recipe,
)
from workbench.bench.load.keys import (
    TUI_SIZE,
    FrameTimedApp,
    press_keys,
    wait_for_runs,
)
from workbench.bench.results import RESULTS_DIR, write_result
from workbench.bench.supervisor import format_value, load_average, percentile, say_on_stderr
from workbench.files import layout, run_control
from workbench.status import STATUSES, read_trainer_state, run_statuses

DURATION_S = 600.0
QUICK_DURATION_S = 60.0
INTERVAL_S = 5.0
STARTUP_TIMEOUT_S = 900.0  # the built-in model may be built first, then vLLM starts
SETTLE_TIMEOUT_S = 60.0


class LoadBenchError(Exception):
    """The experiment could not be brought up: nothing to measure."""


def run_load_benchmark(
    *,
    duration_s: float | None = None,
    quick: bool = False,
    interval_s: float = INTERVAL_S,
    seed: int = 0,
    recipe: Path = SHIPPED_RECIPE,
    keep_outputs: bool = False,
    results_dir: Path = RESULTS_DIR,
    runs_at_once: int = RUNS_AT_ONCE,
    slots: int = SLOTS,
) -> dict[str, Any]:
    duration = duration_s or (QUICK_DURATION_S if quick else DURATION_S)
    scratch = Path(tempfile.mkdtemp(prefix="workbench-load-"))
    exp = FaultExperiment(
        scratch,
        int(RUN_SETTINGS["max_steps"]),
        10,
        recipe_text=load_recipe(recipe, runs_at_once, slots),
    )
    try:
        payload = asyncio.run(measure(exp, duration, interval_s, seed, runs_at_once, slots))
    finally:
        exp.kill_leftovers()
        if not keep_outputs:
            shutil.rmtree(scratch, ignore_errors=True)
    payload.update(seed=seed, quick=quick, recipe=str(recipe))
    if keep_outputs:
        payload["scratch"] = str(scratch)
    payload["summary"] = summary_rows(payload)
    path = write_result("load-quick" if quick else "load", payload, results_dir=results_dir)
    return {**payload, "path": str(path)}


async def measure(
    exp: FaultExperiment,
    duration_s: float,
    interval_s: float,
    seed: int,
    runs_at_once: int = RUNS_AT_ONCE,
    slots: int = SLOTS,
) -> dict[str, Any]:
    load_start = load_average()
    startup_s = await _start_and_fill_slots(exp, slots)
    say_on_stderr(f"load: {slots} slots held after {startup_s:.0f} s; churn for {duration_s:g} s")
    tui, churn_log, transient = await _churn_under_the_tui(
        exp, duration_s, interval_s, seed, runs_at_once
    )
    say_on_stderr(f"load: {churn_log.ticks} ticks, {len(churn_log.added)} runs; checking")
    final = await asyncio.to_thread(settle_and_check, exp, churn_log)
    say_on_stderr("load: down")
    after_down = await asyncio.to_thread(_down_and_check, exp)
    payload = {
        "duration_s": duration_s,
        "interval_s": interval_s,
        "runs_at_once": runs_at_once,
        "slots": slots,
        "run_settings": RUN_SETTINGS,
        "startup_s": round(startup_s, 1),
        "churn": churn_report(churn_log, runs_at_once),
        "slot_problems_longest_s": transient,
        **final,
        "after_down": after_down,
        "tui": tui,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "notes": exp.cli_lines[-6:],
    }
    payload["ok"] = is_ok(payload)
    payload["exit_code"] = 0 if payload["ok"] else 1  # what `bench all` reads as failed
    return payload


async def _start_and_fill_slots(exp: FaultExperiment, slots: int) -> float:
    """`up`, then wait until the trainer holds every slot; the seconds that took."""
    started = time.monotonic()
    say_on_stderr(f"load: up in {exp.scratch}")
    up = await asyncio.to_thread(exp.up)
    if up.returncode != 0:
        raise LoadBenchError(f"up failed: {(up.stdout + up.stderr).strip()[-600:]}")
    full = await asyncio.to_thread(
        exp.wait, lambda: _slots_held(exp.path) >= slots, STARTUP_TIMEOUT_S, 1.0
    )
    if not full:
        raise LoadBenchError(f"the trainer did not fill its {slots} slots in time")
    return time.monotonic() - started


async def _churn_under_the_tui(
    exp: FaultExperiment, duration_s: float, interval_s: float, seed: int, runs_at_once: int
) -> tuple[dict[str, Any], ChurnLog, float]:
    """Keys pressed in the TUI for `duration_s` while runs are added, stopped and evicted
    around it; the TUI's report, the churn's log and its longest slot problems."""
    app = FrameTimedApp(exp.path)
    background = BackgroundLoad(exp.path, interval_s, seed, runs_at_once)
    async with app.run_test(size=TUI_SIZE) as pilot:
        await wait_for_runs(app, runs_at_once, 60.0)
        stop = asyncio.Event()
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        background.start()
        keys = asyncio.create_task(press_keys(app, pilot, stop))
        await asyncio.sleep(duration_s)
        stop.set()
        latencies = await keys
        cpu_s, wall_s = time.process_time() - cpu_before, time.perf_counter() - wall_before
        churn_log, transient = await asyncio.to_thread(background.stop)
        poll_s = list(app.reader.poll_s)
        poll_parts = list(app.reader.poll_parts)
        runs_shown = len(app.snapshot.runs) if app.snapshot else 0
    tui = {
        "size": list(TUI_SIZE),
        "keys": latency_report(latencies.all_s),
        "by_key": {key: latency_report(values) for key, values in latencies.by_key.items()},
        "timed_out": latencies.timed_out,
        "poll": latency_report(poll_s),
        # Where the slowest 5 % of keys and of polls spent their time (`stalls`).
        "key_tail": stalls.mean_of_tail([parts for _, parts in latencies.parts]),
        "poll_tail": stalls.mean_of_tail(poll_parts),
        "slowest_keys": stalls.slowest(latencies.parts),
        "slowest_polls": stalls.slowest([("poll", parts) for parts in poll_parts]),
        "runs_shown_at_end": runs_shown,
        "process_cpu_percent": round(100 * cpu_s / wall_s, 1),
    }
    return tui, churn_log, transient


def _down_and_check(exp: FaultExperiment) -> dict[str, Any]:
    """`down`, then what it left: its exit code, processes still alive, half-written files."""
    down = exp.down()
    orphans = exp.alive()
    half = invariants.half_written(exp.path, set()) if exp.path.is_dir() else []
    return {
        "down_exit": down.returncode,
        "orphans": [f"{seen.pid} {seen.command}" for seen in orphans],
        "half_written": [str(path.relative_to(exp.path)) for path in half],
    }


def _slots_held(experiment: Path) -> int:
    return len((read_trainer_state(experiment) or {}).get("slots") or {})


def settle_and_check(exp: FaultExperiment, log: ChurnLog) -> dict[str, Any]:
    """The checks, once the trainer has caught up with the last changes (or its time is up)."""

    def current() -> tuple[list[str], list[str], list[str]]:
        """Slot problems, lost runs, runs not started (see `checks.lost_runs`)."""
        statuses = run_statuses(exp.path)
        trainer = read_trainer_state(exp.path)
        processes = exp.state().get("processes") or {}
        orchestrators = {
            name: str(record.get("state"))
            for name, record in processes.items()
            if isinstance(record, dict) and record.get("kind") == "orchestrator"
        }
        inference = (processes.get("inference") or {}).get("state")
        return (
            checks.slot_problems(statuses, trainer),
            checks.lost_runs(log.added, statuses, trainer, orchestrators, inference),
            checks.not_started(log.added, orchestrators, inference),
        )

    # Runs go on finishing while this looks, so a slot may be seen held by a run that
    # finished a moment ago: what counts is the reading that settled, or the last one.
    readings: list[tuple[list[str], list[str], list[str]]] = []

    def settled() -> bool:
        readings.append(current())
        return readings[-1][:2] == ([], [])

    settle_started = time.monotonic()
    exp.wait(settled, SETTLE_TIMEOUT_S, 1.0)
    settled_s = time.monotonic() - settle_started
    slots, lost, waiting = readings[-1]
    statuses = run_statuses(exp.path)
    counts = {name: sum(s.status == name for s in statuses) for name in STATUSES}
    metrics = []
    for status in statuses:
        run = layout.run_dir(exp.path, status.id)
        metrics += checks.metrics_problems(run, run_control.is_finished(run))
    return {
        "settled_s": round(settled_s, 1),
        "runs": {"added": len(log.added), **counts, "lost": lost, "not_started": waiting},
        "slot_problems": slots,
        "supervisor_alive": exp.supervisor_pid() is not None,
        "crashes": checks.crash_problems(exp.state()),
        "metrics_problems": metrics,
        "listeners": listening_problems(exp),
    }


def churn_report(log: ChurnLog, runs_at_once: int = RUNS_AT_ONCE) -> dict[str, Any]:
    return {
        "ticks": log.ticks,
        "added": len(log.added) - runs_at_once,  # beyond the recipe's own
        "evicted_active": len(log.evicted_active),
        "evicted_waiting": len(log.evicted_waiting),
        "errors": log.errors[:20],
        "tick": latency_report(log.tick_s),
    }


def latency_report(seconds: list[float]) -> dict[str, Any]:
    ms = [1000 * value for value in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 0.5), 1),
        "p95_ms": round(percentile(ms, 0.95), 1),
        "max_ms": round(max(ms), 1) if ms else float("nan"),
    }


def is_ok(payload: dict[str, Any]) -> bool:
    return (
        payload["supervisor_alive"]
        and not payload["crashes"]
        and not payload["slot_problems"]
        and not payload["runs"]["lost"]
        and not payload["metrics_problems"]
        and not payload["listeners"]
        and not payload["churn"]["errors"]
        and not payload["after_down"]["orphans"]
        and not payload["after_down"]["half_written"]
        and not payload["tui"]["timed_out"]
    )


def summary_rows(payload: dict[str, Any]) -> list[dict[str, Any]]:
    runs, tui, churn = payload["runs"], payload["tui"], payload["churn"]
    keys, poll = tui["keys"], tui["poll"]
    return [
        _row("runs added / evicted", f"{runs['added']} / {churn['evicted_active'] + churn['evicted_waiting']}"),
        _row("runs finished / not started (inference not ready) / lost",
             f"{runs['finished']} / {len(runs.get('not_started', []))} / {len(runs['lost'])}"),
        _row("leaked slots, crashes", f"{len(payload['slot_problems'])}, {len(payload['crashes'])}"),
        _row("incomplete metrics", len(payload["metrics_problems"])),
        _row("processes left after down", len(payload["after_down"]["orphans"])),
        _row("slot free or stale, longest", payload["slot_problems_longest_s"], "s"),
        _row(f"TUI key-to-screen p50 / p95 / max ({keys['n']} keys)",
             f"{keys['p50_ms']:.0f} / {keys['p95_ms']:.0f} / {keys['max_ms']:.0f}", "ms"),
        _row("TUI keys timed out", sum(tui["timed_out"].values())),
        _row(f"TUI poll p50 / p95 ({tui['runs_shown_at_end']} runs)",
             f"{poll['p50_ms']:.0f} / {poll['p95_ms']:.0f}", "ms"),
        _row("TUI process CPU", tui["process_cpu_percent"], "% core"),
        _row("slowest 5 % of keys: ran / waited for CPU / rest (gc) [other threads ran]",
             _parts(tui["key_tail"]), "ms"),
        _row("slowest 5 % of polls: ran / waited for CPU / rest (gc) [other threads ran]",
             _parts(tui["poll_tail"]), "ms"),
        _row("all checks passed", "yes" if payload["ok"] else "NO"),
    ]  # fmt: skip


def _parts(tail: dict[str, Any] | None) -> str:
    """A tail's mean parts (`stalls.mean_of_tail`) as one cell."""
    if tail is None:
        return "none"
    wait = "?" if tail["cpu_wait_ms"] is None else f"{tail['cpu_wait_ms']:.0f}"
    others = tail.get("others_cpu_ms")
    others_ran = "?" if others is None else f"{others:.0f}"
    return (
        f"{tail['cpu_ms']:.0f} / {wait} / {tail['other_ms']:.0f} ({tail['gc_ms']:.0f})"
        f" [{others_ran}]"
    )


def _row(metric: str, value: Any, unit: str | None = None) -> dict[str, Any]:
    return {"metric": metric, "value": value, "unit": unit}


def format_table(payload: dict[str, Any]) -> str:
    width = max(len(row["metric"]) for row in payload["summary"])
    load = payload["load_average_start"][0]
    lines = [
        f"load: {payload['duration_s']:g} s, a run evicted and runs added every "
        f"{payload['interval_s']:g} s, {payload['runs_at_once']} runs on {payload['slots']} slots "
        f"(load average at start {load:.2f})"
    ]
    for row in payload["summary"]:
        lines.append(f"  {row['metric'].ljust(width)}  {format_value(row['value'], row['unit'])}")
    problems = [
        *payload["crashes"], *payload["slot_problems"], *payload["runs"]["lost"],
        *payload["metrics_problems"], *payload["listeners"], *payload["churn"]["errors"],
        *payload["after_down"]["orphans"], *payload["after_down"]["half_written"],
    ]  # fmt: skip
    lines += [f"  ! {problem}" for problem in problems[:20]]
    return "\n".join(lines)
