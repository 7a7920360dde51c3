"""`workbench bench supervisor`: how fast runs are discovered, and what the TUI costs.

Three measurements, each against the real thing on this machine:

- discovery latency: a real supervisor (daemon, file watcher, state.json) runs the stand-in plan
  of the supervisor tests (`workbench/testing/standins.py`: small Python processes instead of
  vLLM, torchrun and orchestrators, so the supervisor's own latency is what is timed). A new
  `run_*` directory with a valid `control/orch.toml` appears, either the way `workbench runs
  add` writes it (`write_run`: the directory, then orch.toml atomically) or moved into place
  whole (built under a hidden name, then renamed). One sample is the time until
  `supervisor/state.json` shows the run's orchestrator running (polled every few ms), and
  until the orchestrator was spawned (its `started_at`). The run is deleted afterwards, so
  every sample starts from the same state.
- TUI idle CPU: the real `WorkbenchApp` on an experiment with 8 runs (metrics history, logs,
  8 stand-in orchestrators under a real supervisor), left alone: CPU time of the process over
  wall time, in % of one core. Headless (`App.run_test`, which computes every screen update
  but writes none to a terminal) and, when tmux is installed, in a real terminal
  (`python -m workbench.tui` in tmux, measured through /proc).
- log throughput: while the same app runs, a separate process appends numbered lines to a
  log that the app's log pane follows, at increasing rates. Per rate: how many lines the pane
  shows when the writer stops, how long until it shows the last one, the event loop's worst
  stall (what a key press would wait) and the app's CPU. The pane keeps up with a rate when
  it shows the last line within `CATCH_UP_LIMIT_S` of the writer stopping.

Timings only; correctness lives in the tests. Results go to `write_result("supervisor", ...)`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.files import layout
from workbench.supervisor.lifecycle import STARTED_STATES
from workbench.system.clock import now_iso
from workbench.system.polling import wait_until
from workbench.system.procfs import cpu_seconds
from workbench.testing import standins

RECIPE = """\
[experiment]
name = "{name}"
output_dir = "{output_dir}"

[model]
base = "builtin:tiny-reverse"

[defaults]
max_steps = 200
"""
# Inference ready at once; orchestrators run until stopped (no --finish-after), so a
# discovered run stays "running" long enough to be seen.
STANDINS = {
    "processes": [
        {"name": "inference", "kind": "inference", "ready": True, "args": ["--ready-after", "0.1"]},
        {"name": "trainer", "kind": "trainer"},
    ],
    "orchestrator": {},
}
DISCOVERY_MODES = ("write_run", "rename")
STATE_POLL_S = 0.005
TUI_RUNS = 8
TUI_SIZE = (160, 48)
# Time the app gets after its first poll before idle is measured (first log read, layout).
SETTLE_S = 2.0
CATCH_UP_LIMIT_S = 1.0
# How often the stall probe wakes up in the app's event loop during a log burst.
STALL_PROBE_S = 0.02
LOG_LINE_FILLER = (
    b"2025-01-01 12:00:00 INFO orchestrator step 42: reward_mean=0.734 "
    b"completion_len=57 wait_s=0.012 generation_s=0.53"
)


@dataclass(frozen=True)
class SupervisorBenchSettings:
    """How much to measure; `quick()` is a smoke test of the whole benchmark."""

    trials: int = 10
    idle_s: float = 15.0
    log_rates: tuple[int, ...] = (1_000, 3_000, 10_000, 30_000, 100_000, 300_000)
    log_seconds: float = 4.0
    tmux: bool = True

    @classmethod
    def quick(cls) -> SupervisorBenchSettings:
        return cls(trials=3, idle_s=5.0, log_rates=(1_000, 10_000), log_seconds=2.0)


@dataclass(frozen=True)
class DiscoverySample:
    mode: str
    run_id: str
    spawned_ms: float
    visible_ms: float


@dataclass(frozen=True)
class LogRateResult:
    """One offered rate. "Shown" counts lines that reached the pane's `Log` widget (it keeps
    only the last `max_lines`: `retained_lines`); delivered = lines shown per second from the
    first line written until the last one was shown (or the benchmark gave up waiting)."""

    offered_lines_per_s: int
    written_lines: int
    writer_lines_per_s: float
    shown_when_writer_stopped: int
    lag_lines_at_end: int
    catch_up_s: float | None
    delivered_lines_per_s: float
    retained_lines: int
    paused: bool
    max_loop_stall_ms: float
    p99_loop_stall_ms: float
    app_cpu_percent: float
    kept_up: bool


# Where progress lines go; stderr by default, so stdout is only the table.
Progress = Callable[[str], None]


def say_on_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- small helpers


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def percentile(values: list[float], fraction: float) -> float:
    """The `fraction` quantile, interpolated between samples (NaN when there are none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def latency_summary(values_ms: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(percentile(values_ms, 0.5), 1),
        "p90_ms": round(percentile(values_ms, 0.9), 1),
        "max_ms": round(max(values_ms), 1) if values_ms else float("nan"),
    }


def process_record(experiment: Path, name: str) -> dict[str, Any]:
    from workbench.supervisor.client import read_state

    state = read_state(experiment) or {}
    record = (state.get("processes") or {}).get(name)
    return record if isinstance(record, dict) else {}


def is_live(experiment: Path, name: str) -> bool:
    return process_record(experiment, name).get("state") in STARTED_STATES


# ---------------------------------------------------------------- a supervisor on stand-ins


def new_standin_experiment(root: Path, name: str) -> Path:
    experiment = root / name
    experiment.mkdir(parents=True)
    layout.atomic_write_text(
        layout.recipe_path(experiment), RECIPE.format(name=name, output_dir=experiment)
    )
    layout.atomic_write_text(standins.config_path(experiment), json.dumps(STANDINS))
    return experiment


@contextlib.contextmanager
def running_supervisor(experiment: Path) -> Iterator[int]:
    """A real supervisor on the stand-in plan, inference ready; stopped (no orphans) after."""
    from workbench.supervisor.launch import start_daemon, stop_experiment

    started = start_daemon(experiment, plan=standins.PLAN_REFERENCE)
    try:
        wait_until(
            lambda: process_record(experiment, "inference").get("state") == "ready",
            30.0,
            "the stand-in inference to be ready",
        )
        yield started.pid
    finally:
        stop_experiment(experiment, timeout_s=30.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            started.process.wait(timeout=10)


# ---------------------------------------------------------------- discovery latency


def create_run_in_place(experiment: Path, run_id: str) -> Path:
    """What `workbench runs add` does: the directory, then its orch.toml written atomically."""
    from workbench.config import OrchestratorConfig
    from workbench.experiment import write_run

    return write_run(experiment, run_id, OrchestratorConfig())


def create_run_by_rename(experiment: Path, run_id: str) -> Path:
    """A whole run directory built under a hidden name, then renamed into place at once."""
    from workbench.config import OrchestratorConfig
    from workbench.experiment import orch_toml_text

    staging = Path(tempfile.mkdtemp(prefix=f".{run_id}.", dir=experiment))
    layout.atomic_write_text(
        layout.orch_config_path(staging), orch_toml_text(run_id, OrchestratorConfig())
    )
    run = layout.run_dir(experiment, run_id)
    os.rename(staging, run)
    return run


RUN_CREATORS: dict[str, Callable[[Path, str], Path]] = {
    "write_run": create_run_in_place,
    "rename": create_run_by_rename,
}


def measure_one_discovery(experiment: Path, run_id: str, mode: str) -> DiscoverySample:
    from workbench.supervisor.lifecycle import TERMINAL_STATES
    from workbench.system.clock import unix_time

    created_wall = time.time()
    created = time.perf_counter()
    run = RUN_CREATORS[mode](experiment, run_id)
    while True:
        record = process_record(experiment, run_id)
        if record.get("state") in STARTED_STATES:
            visible = time.perf_counter()
            break
        if time.perf_counter() - created > 30.0:
            raise TimeoutError(f"the supervisor did not start {run_id} within 30 s")
        time.sleep(STATE_POLL_S)
    spawned_at = unix_time(record.get("started_at"))
    spawned_ms = (spawned_at - created_wall) * 1000 if spawned_at else float("nan")
    # Delete the run so the next sample starts from the same state (and the machine stays
    # quiet): the supervisor stops its orchestrator.
    shutil.rmtree(run)
    wait_until(
        lambda: process_record(experiment, run_id).get("state") in TERMINAL_STATES,
        30.0,
        f"{run_id}'s orchestrator to stop after its directory was deleted",
    )
    return DiscoverySample(mode, run_id, round(spawned_ms, 1), round((visible - created) * 1000, 1))


def measure_discovery(root: Path, trials: int, progress: Progress) -> dict[str, Any]:
    experiment = new_standin_experiment(root, "discovery")
    samples: list[DiscoverySample] = []
    load_before = load_average()
    with running_supervisor(experiment):
        for trial in range(trials):
            for mode in DISCOVERY_MODES:
                sample = measure_one_discovery(experiment, f"run_{mode}_{trial}", mode)
                samples.append(sample)
                progress(
                    f"  discovery {mode} #{trial}: state.json {sample.visible_ms:.0f} ms "
                    f"(spawned after {sample.spawned_ms:.0f} ms)"
                )
                # Not in lockstep with the supervisor's 0.2 s tick.
                time.sleep(0.13)
    per_mode = {
        mode: {
            "visible": latency_summary([s.visible_ms for s in samples if s.mode == mode]),
            "spawned": latency_summary([s.spawned_ms for s in samples if s.mode == mode]),
        }
        for mode in DISCOVERY_MODES
    }
    return {
        "trials_per_mode": trials,
        "state_poll_ms": STATE_POLL_S * 1000,
        "modes": per_mode,
        "samples": [asdict(s) for s in samples],
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


# ---------------------------------------------------------------- a synthetic 8-run experiment


def metrics_history(steps: int, now: float, seed: int) -> str:
    """`metrics.jsonl` text: an orchestrator and a trainer line per step, reward rising."""
    lines = []
    for step in range(1, steps + 1):
        when = now - (steps - step) * 5.0
        reward = min(1.0, 0.2 + 0.003 * step + 0.01 * seed)
        lines.append(
            {"source": "orchestrator", "step": step, "time": when, "reward_mean": reward,
             "reward_std": 0.1, "reward_min": 0.0, "reward_max": 1.0, "completion_len_mean": 40.0,
             "truncated_frac": 0.0, "generation_s": 0.5, "wait_s": 0.01, "policy_version": step}
        )  # fmt: skip
        lines.append(
            {"source": "trainer", "step": step, "time": when + 0.5, "loss": 1.0 / step,
             "grad_norm": 0.5, "lr": 3e-4, "tokens": 4096, "samples": 64, "step_s": 1.2}
        )  # fmt: skip
    return "".join(json.dumps(line) + "\n" for line in lines)


def build_tui_experiment(root: Path, runs: int = TUI_RUNS, steps: int = 150) -> Path:
    """An experiment with `runs` runs, each with metrics and an orchestrator log."""
    from workbench.config import OrchestratorConfig
    from workbench.experiment import write_run

    experiment = new_standin_experiment(root, "tui")
    now = time.time()
    for index in range(runs):
        run_id = f"run_{index}"
        run = write_run(experiment, run_id, OrchestratorConfig())
        layout.atomic_write_text(layout.metrics_path(run), metrics_history(steps, now, index))
        log = layout.orchestrator_log_path(run)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(f"step {s}: reward {0.2 + 0.003 * s:.3f}\n" for s in range(steps)))
    return experiment


def publish_trainer_slots(experiment: Path, run_ids: list[str], steps: int = 150) -> None:
    """What the real trainer writes (the stand-in trainer does not): every run has a slot."""
    trainer_pid = process_record(experiment, "trainer").get("pid")
    state = {
        "max_runs": len(run_ids),
        "pid": trainer_pid,
        "slots": {str(slot): run_id for slot, run_id in enumerate(run_ids)},
        "progress": {
            run_id: {"step": steps, "total_tokens": steps * 4096, "total_samples": steps * 64}
            for run_id in run_ids
        },
        "waiting": [],
        "updated_at": now_iso(),
    }
    layout.atomic_write_text(layout.trainer_state_path(experiment), json.dumps(state))


# ---------------------------------------------------------------- the TUI, headless


async def measure_tui_headless(
    experiment: Path, supervisor_pid: int, settings: SupervisorBenchSettings, progress: Progress
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Idle CPU, then log throughput, in one app session (Textual imported only here)."""
    from workbench.tui.app import WorkbenchApp

    app = WorkbenchApp(experiment)
    async with app.run_test(size=TUI_SIZE):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0
        while not (app.snapshot and len(app.snapshot.runs) == TUI_RUNS and app.polls >= 2):
            if loop.time() > deadline:
                raise TimeoutError(f"the TUI did not show the {TUI_RUNS} runs within 30 s")
            await asyncio.sleep(0.05)
        await asyncio.sleep(SETTLE_S)
        idle = await measure_idle_app(app, supervisor_pid, settings.idle_s)
        progress(
            f"  TUI idle (headless): {idle['app_cpu_percent']:.1f}% of a core; "
            f"supervisor {idle['supervisor_cpu_percent']:.1f}%"
        )
        log_throughput = await measure_log_throughput(app, experiment, settings, progress)
    return idle, log_throughput


async def measure_idle_app(app: Any, supervisor_pid: int, idle_s: float) -> dict[str, Any]:
    """CPU of this process (the app and its workers) while nobody touches it."""
    polls_before = app.polls
    load_before = load_average()
    supervisor_before = cpu_seconds(supervisor_pid)
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    await asyncio.sleep(idle_s)
    cpu_s, wall_s = time.process_time() - cpu_before, time.perf_counter() - wall_before
    supervisor_s = cpu_seconds(supervisor_pid) - supervisor_before
    return {
        "seconds": round(wall_s, 2),
        "app_cpu_percent": round(100 * cpu_s / wall_s, 2),
        "supervisor_cpu_percent": round(100 * supervisor_s / wall_s, 2),
        "polls": app.polls - polls_before,
        "runs_shown": len(app.snapshot.runs) if app.snapshot else 0,
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


async def measure_log_throughput(
    app: Any, experiment: Path, settings: SupervisorBenchSettings, progress: Progress
) -> dict[str, Any]:
    # The stalls the app has anyway (its 1 s poll, this machine's other jobs), to compare
    # the stalls under a growing log with.
    quiet_stalls = await probe_loop_stalls(settings.log_seconds)
    rates: list[LogRateResult] = []
    load_before = load_average()
    for rate in settings.log_rates:
        result = await measure_log_rate(app, experiment, rate, settings.log_seconds)
        rates.append(result)
        progress(
            f"  log {rate:,}/s: shown {result.shown_when_writer_stopped:,} of "
            f"{result.written_lines:,} when the writer stopped, caught up in "
            f"{_seconds_text(result.catch_up_s)}, worst stall {result.max_loop_stall_ms:.0f} ms"
        )
        if not result.kept_up:
            break  # higher rates fall behind too
    kept_up = [r.offered_lines_per_s for r in rates if r.kept_up]
    return {
        "seconds_per_rate": settings.log_seconds,
        "catch_up_limit_s": CATCH_UP_LIMIT_S,
        "line_bytes": len(b"%010d %s\n" % (0, LOG_LINE_FILLER)),
        "max_lines_retained": app.log_max_lines,
        "quiet_max_loop_stall_ms": round(1000 * max(quiet_stalls, default=0.0), 1),
        "quiet_p99_loop_stall_ms": round(1000 * percentile(quiet_stalls, 0.99), 1),
        "sustained_lines_per_s": max(kept_up, default=0),
        "peak_delivered_lines_per_s": max((r.delivered_lines_per_s for r in rates), default=0),
        "rates": [asdict(r) for r in rates],
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


async def probe_loop_stalls(seconds: float) -> list[float]:
    """How late each `STALL_PROBE_S` sleep in the app's event loop wakes up, for `seconds`."""
    loop = asyncio.get_running_loop()
    stalls = []
    ends = loop.time() + seconds
    while loop.time() < ends:
        before = loop.time()
        await asyncio.sleep(STALL_PROBE_S)
        stalls.append(max(0.0, loop.time() - before - STALL_PROBE_S))
    return stalls


def _seconds_text(seconds: float | None) -> str:
    return "never (gave up)" if seconds is None else f"{seconds:.2f} s"


def shown_line_count(pane: Any) -> int:
    """Lines the pane has shown so far: the number on its last line, plus one."""
    lines = pane.log.lines
    if not lines:
        return 0
    try:
        return int(lines[-1][:10]) + 1
    except ValueError:
        return 0


async def measure_log_rate(app: Any, experiment: Path, rate: int, seconds: float) -> LogRateResult:
    from workbench.tui.widgets.log_pane import LogPane, LogTarget

    pane = app.screen.query_one(LogPane)
    path = layout.logs_dir(experiment) / f"bench-{rate}.log"
    path.unlink(missing_ok=True)
    pane.follow(LogTarget(f"bench {rate}/s", path))
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0.5)  # the tail worker is started and waiting for the file

    cpu_before, wall_before = time.process_time(), time.perf_counter()
    writer = subprocess.Popen(
        [sys.executable, "-m", "workbench.bench.supervisor", "--write-log", str(path),
         "--rate", str(rate), "--seconds", str(seconds)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    # (wall clock, lines shown) every probe: the writer reports when it wrote its first and
    # last line on the same clock, so lag and catch-up do not include its process start/exit.
    timeline: list[tuple[float, int]] = []
    stalls: list[float] = []
    while writer.poll() is None:
        before = loop.time()
        await asyncio.sleep(STALL_PROBE_S)
        stalls.append(max(0.0, loop.time() - before - STALL_PROBE_S))
        timeline.append((time.time(), shown_line_count(pane)))
    written = json.loads(writer.stdout.read() if writer.stdout else "{}")
    total, first_at, last_at = written["lines"], written["first_at"], written["last_at"]
    give_up = time.time() + max(10 * CATCH_UP_LIMIT_S, seconds)
    while timeline[-1][1] < total and time.time() < give_up:
        await asyncio.sleep(0.01)
        timeline.append((time.time(), shown_line_count(pane)))
    cpu_s, wall_s = time.process_time() - cpu_before, time.perf_counter() - wall_before

    shown_at_stop = max((shown for when, shown in timeline if when <= last_at), default=0)
    caught_up_at = next((when for when, shown in timeline if shown >= total), None)
    catch_up_s = None if caught_up_at is None else max(0.0, caught_up_at - last_at)
    delivered_until = caught_up_at if caught_up_at is not None else timeline[-1][0]
    result = LogRateResult(
        offered_lines_per_s=rate,
        written_lines=total,
        writer_lines_per_s=round(total / max(last_at - first_at, 1e-9), 0),
        shown_when_writer_stopped=shown_at_stop,
        lag_lines_at_end=total - shown_at_stop,
        catch_up_s=None if catch_up_s is None else round(catch_up_s, 3),
        delivered_lines_per_s=round(timeline[-1][1] / max(delivered_until - first_at, 1e-9), 0),
        retained_lines=pane.log.line_count,
        paused=pane.paused,
        max_loop_stall_ms=round(1000 * max(stalls, default=0.0), 1),
        p99_loop_stall_ms=round(1000 * percentile(stalls, 0.99), 1),
        app_cpu_percent=round(100 * cpu_s / wall_s, 1),
        kept_up=catch_up_s is not None and catch_up_s <= CATCH_UP_LIMIT_S,
    )
    path.unlink(missing_ok=True)  # a fast rate writes tens of MB: keep the disk clean
    return result


# ---------------------------------------------------------------- the TUI in a real terminal


def measure_tui_in_tmux(experiment: Path, idle_s: float, progress: Progress) -> dict[str, Any]:
    """Idle CPU of `python -m workbench.tui` in a detached tmux session of the same size."""
    tmux = shutil.which("tmux")
    if tmux is None:
        return {"skipped": "tmux is not installed"}
    socket = f"workbench-bench-{uuid.uuid4().hex[:8]}"  # a private server: nobody else's tmux

    def run_tmux(*args: str) -> str:
        return subprocess.run(
            [tmux, "-L", socket, *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout

    width, height = TUI_SIZE
    command = f"exec {shlex.quote(sys.executable)} -m workbench.tui {shlex.quote(str(experiment))}"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
    subprocess.run(
        [tmux, "-L", socket, "-f", "/dev/null", "new-session", "-d", "-s", "tui",
         "-x", str(width), "-y", str(height), command],
        check=True, timeout=10, env=env,
    )  # fmt: skip
    try:
        pid = int(run_tmux("list-panes", "-t", "tui", "-F", "#{pane_pid}").split()[0])
        last_run = f"run_{TUI_RUNS - 1}"
        wait_until(
            lambda: last_run in run_tmux("capture-pane", "-p", "-t", "tui"),
            60.0,
            "the TUI in tmux to show the runs",
        )
        time.sleep(SETTLE_S)
        load_before = load_average()
        cpu_before, wall_before = cpu_seconds(pid), time.perf_counter()
        time.sleep(idle_s)
        cpu_s = cpu_seconds(pid) - cpu_before
        wall_s = time.perf_counter() - wall_before
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            run_tmux("kill-server")
    result = {
        "seconds": round(wall_s, 2),
        "app_cpu_percent": round(100 * cpu_s / wall_s, 2),
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }
    progress(f"  TUI idle (tmux): {result['app_cpu_percent']:.1f}% of a core")
    return result


# ---------------------------------------------------------------- the whole benchmark


def run_supervisor_benchmark(
    settings: SupervisorBenchSettings,
    workdir: Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every measurement; the payload for `write_result("supervisor", ...)`, with "summary".

    Experiments are created under `workdir` (a temporary directory, removed afterwards, when
    None); every supervisor started is stopped before this returns.
    """
    progress = progress or say_on_stderr
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="wb-bench-"))
    try:
        load_start = load_average()
        progress("supervisor: discovery latency")
        discovery = measure_discovery(root, settings.trials, progress)
        progress(f"supervisor: TUI with {TUI_RUNS} runs")
        experiment = build_tui_experiment(root)
        with running_supervisor(experiment) as supervisor_pid:
            run_ids = [f"run_{index}" for index in range(TUI_RUNS)]
            wait_until(
                lambda: all(is_live(experiment, run_id) for run_id in run_ids),
                60.0,
                f"{TUI_RUNS} stand-in orchestrators to run",
            )
            publish_trainer_slots(experiment, run_ids)
            idle, log_throughput = asyncio.run(
                measure_tui_headless(experiment, supervisor_pid, settings, progress)
            )
            tmux_idle: dict[str, Any] = {"skipped": "--no-tmux"}
            if settings.tmux:
                try:
                    tmux_idle = measure_tui_in_tmux(experiment, settings.idle_s, progress)
                except (TimeoutError, OSError, subprocess.SubprocessError) as err:
                    # The headless numbers are still worth keeping: say why, go on.
                    tmux_idle = {"failed": f"{type(err).__name__}: {err}"}
                    progress(f"  TUI idle (tmux) failed: {tmux_idle['failed']}")
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    payload = {
        "settings": asdict(settings),
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "discovery": discovery,
        "tui_idle": {"runs": TUI_RUNS, "size": list(TUI_SIZE), "headless": idle, "tmux": tmux_idle},
        "log_throughput": log_throughput,
    }
    payload["summary"] = summary_rows(payload)
    return payload


def summary_rows(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The headline numbers: one row each (metric, value, unit)."""
    rows = []
    for mode, label in (("write_run", "runs add"), ("rename", "dir renamed in")):
        visible = payload["discovery"]["modes"][mode]["visible"]
        rows.append(_row(f"discovery, {label}: median", visible["median_ms"], "ms"))
        rows.append(_row(f"discovery, {label}: p90", visible["p90_ms"], "ms"))
    headless, tmux = payload["tui_idle"]["headless"], payload["tui_idle"]["tmux"]
    runs = f"{TUI_RUNS} runs"
    rows.append(_row(f"TUI idle CPU, {runs} (headless)", headless["app_cpu_percent"], "% core"))
    if "app_cpu_percent" in tmux:
        rows.append(_row(f"TUI idle CPU, {runs} (tmux)", tmux["app_cpu_percent"], "% core"))
    supervisor_cpu = headless["supervisor_cpu_percent"]
    rows.append(_row(f"supervisor idle CPU, {runs}", supervisor_cpu, "% core"))
    logs = payload["log_throughput"]
    rows.append(_row("log pane keeps up with", logs["sustained_lines_per_s"], "lines/s"))
    rows.append(_row("log pane, most lines shown", logs["peak_delivered_lines_per_s"], "lines/s"))
    return rows


def _row(metric: str, value: float, unit: str) -> dict[str, Any]:
    return {"metric": metric, "value": value, "unit": unit}


def print_table(payload: dict[str, Any]) -> None:
    from rich.table import Table

    from workbench.system.console import output_console

    load = payload["load_average_start"]
    table = Table(title=f"supervisor and TUI (load average at start {load[0]:.2f})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for row in payload["summary"]:
        table.add_row(row["metric"], format_value(row["value"], row.get("unit")))
    rates = Table(title="log pane under a growing log")
    for column in ("offered/s", "written", "shown at stop", "caught up", "worst stall", "CPU"):
        rates.add_column(column, justify="right")
    for rate in payload["log_throughput"]["rates"]:
        rates.add_row(
            f"{rate['offered_lines_per_s']:,}", f"{rate['written_lines']:,}",
            f"{rate['shown_when_writer_stopped']:,}", _seconds_text(rate["catch_up_s"]),
            f"{rate['max_loop_stall_ms']:.0f} ms", f"{rate['app_cpu_percent']:.0f}%",
        )  # fmt: skip
    console = output_console()  # tables whole when piped or logged
    console.print(table)
    console.print(rates)


def format_value(value: Any, unit: str | None = None) -> str:
    if isinstance(value, float) and value != value:
        text = "n/a"
    elif isinstance(value, int | float) and not isinstance(value, bool):
        text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"
    else:
        text = str(value)
    return f"{text} {unit}" if unit else text


# ---------------------------------------------------------------- the log writer (a process)


def write_log(path: Path, rate: int, seconds: float) -> dict[str, float]:
    """Append numbered lines to `path` at `rate` lines/s for `seconds`, in 10 ms slices.

    Returns the lines written and when (unix time) the first and the last were written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    total = int(rate * seconds)
    written = 0
    first_at = last_at = time.time()
    started = time.perf_counter()
    try:
        while written < total:
            elapsed = time.perf_counter() - started
            due = min(int(rate * elapsed) + 1, total) - written
            if due > 0:
                chunk = b"".join(
                    b"%010d %s\n" % (number, LOG_LINE_FILLER)
                    for number in range(written, written + due)
                )
                os.write(fd, chunk)
                last_at = time.time()
                if written == 0:
                    first_at = last_at
                written += due
            time.sleep(0.01)
    finally:
        os.close(fd)
    return {"lines": written, "first_at": first_at, "last_at": last_at}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The log writer of `workbench bench supervisor`.")
    parser.add_argument("--write-log", type=Path, required=True)
    parser.add_argument("--rate", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(write_log(args.write_log, args.rate, args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
