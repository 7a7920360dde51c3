"""`workbench bench discovery`: what following an experiment's file events costs, for this
tree and a baseline tree side by side, in one sitting.

Each tree is measured in a child process whose `workbench` is that tree (PYTHONPATH), so
both run this same measuring code against their own discovery (`RunDirectoryWatcher`) and
TUI change feed (`ExperimentChanges`, through the TUI's `ExperimentReader`):

- threads: a real supervisor's (stand-in plan, finished runs: no orchestrator, every run
  directory watched; /proc's count) and those a TUI reader's first poll adds, at each run
  count; the inotify watches each holds;
- discovery's CPU per minute at 300 active runs: a process running what the supervisor's
  loop runs for discovery (the watcher; a rescan after each change and every 2 s) while
  another process writes what training runs write (lines to logs it keeps open, a metrics
  record, a rollout, a checkpoint and a broadcast per step, pruned to the last two, staged
  and renamed as the real writers do); the events that reached discovery's handler and the
  rescans they caused;
- the TUI reader's CPU per minute at 300 active runs, polling every second (its change
  feed's thread included);
- discovery latency: `bench supervisor`'s (a new run directory to its orchestrator started
  and shown in state.json), median and p90.

The choices are measured too: discovery's CPU with one recursive schedule of the
experiment instead of the experiment directory alone (with the TUI feed's event filter,
and with none: every event kind, watchdog's default), and the threads of one watchdog
schedule per run directory and per `control/` (discovery before f1f46a1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

RUN_COUNTS = (16, 100, 300)
CPU_RUNS = 300
RESCAN_S = 2.0  # the supervisor's (workbench.supervisor.daemon.RESCAN_S)
TICK_S = 0.2  # the supervisor's loop wakes at least this often


# ---------------------------------------------------------------- experiments


def make_runs(experiment: Path, count: int, *, finished: bool) -> list[Path]:
    from workbench.config import OrchestratorConfig
    from workbench.experiment import orch_toml_text
    from workbench.files import layout, run_control

    runs = []
    for index in range(count):
        run_id = f"run_{index:03d}"
        run = layout.run_dir(experiment, run_id)
        layout.atomic_write_text(
            layout.orch_config_path(run), orch_toml_text(run_id, OrchestratorConfig())
        )
        for name in ("logs", "rollouts", "checkpoints", "broadcast"):
            (run / name).mkdir(exist_ok=True)
        if finished:
            run_control.mark_finished(run, 1)
        runs.append(run)
    return runs


def inotify_watches(pid: int | str = "self") -> int:
    """How many inotify watches the process holds (one `inotify wd:` line each)."""
    count = 0
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(f"{fd_dir}/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                count += sum(line.startswith("inotify wd:") for line in info)
        except OSError:
            continue
    return count


def process_threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError(f"no thread count for pid {pid}")


# ---------------------------------------------------------------- threads


def supervisor_threads(root: Path, runs: int) -> dict[str, int]:
    from workbench.bench.supervisor import new_standin_experiment, running_supervisor

    experiment = new_standin_experiment(root, f"threads_{runs}")
    make_runs(experiment, runs, finished=True)
    with running_supervisor(experiment) as pid:
        time.sleep(2 * RESCAN_S + 0.5)  # two rescans: every run directory watched
        return {"threads": process_threads(pid), "inotify_watches": inotify_watches(pid)}


def tui_reader_threads(root: Path, runs: int) -> dict[str, int]:
    from workbench.tui.data import ExperimentReader

    experiment = root / f"tui_{runs}"
    experiment.mkdir()
    make_runs(experiment, runs, finished=False)
    before = threading.active_count()
    watches_before = inotify_watches()
    reader = ExperimentReader(experiment, supervisor_pid=lambda _: None)
    reader.poll()
    time.sleep(0.5)
    reader.poll()
    result = {
        "threads_added": threading.active_count() - before,
        "inotify_watches": inotify_watches() - watches_before,
    }
    reader.close()
    return result


def per_directory_schedule_threads(root: Path, runs: int) -> dict[str, int]:
    """The alternative: one watchdog schedule per run directory and per control/."""
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    experiment = root / f"per_directory_{runs}"
    experiment.mkdir()
    before = threading.active_count()
    observer = Observer()
    observer.start()
    handler = FileSystemEventHandler()
    observer.schedule(handler, os.fspath(experiment))
    for run in make_runs(experiment, runs, finished=False):
        observer.schedule(handler, os.fspath(run))
        observer.schedule(handler, os.fspath(run / "control"))
    added = threading.active_count() - before
    observer.stop()
    observer.join()
    return {"threads_added": added}


# ---------------------------------------------------------------- discovery's CPU


def write_activity(experiment: Path, runs: int, seconds: float, step_every_s: float) -> None:
    """What `runs` training runs write for `seconds`, each a step every `step_every_s`
    (staggered): 20 lines to its open log, a metrics record (open, append, close), a
    rollout, a checkpoint and a broadcast (staged, renamed), the old ones pruned."""
    run_dirs = sorted(p for p in experiment.iterdir() if p.name.startswith("run_"))[:runs]
    logs = [open(run / "logs" / "orchestrator.log", "a", buffering=1) for run in run_dirs]  # noqa: SIM115
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < seconds:
        for index, run in enumerate(run_dirs):
            due = start + step * step_every_s + index * step_every_s / len(run_dirs)
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            for line in range(20):
                logs[index].write(f"step {step} line {line}: reward 0.5\n")
            with open(run / "metrics.jsonl", "a") as metrics:
                metrics.write(json.dumps({"step": step, "reward": 0.5}) + "\n")
            for kind, files in (
                ("rollouts", ("batch.json",)),
                ("checkpoints", ("orchestrator_state.json", "STABLE")),
                ("broadcast", ("adapter_model.safetensors", "adapter_config.json", "STABLE")),
            ):
                staging = run / kind / f".step_{step}.tmp"
                staging.mkdir()
                for name in files:
                    (staging / name).write_bytes(b"x" * 256)
                os.rename(staging, run / kind / f"step_{step}")
                shutil.rmtree(run / kind / f"step_{step - 2}", ignore_errors=True)
        step += 1
    for log_file in logs:
        log_file.close()


def discovery_cpu(root: Path, seconds: float, step_every_s: float) -> dict[str, Any]:
    """Discovery's part of the supervisor's loop, alone in this process, under activity
    written by another process."""
    from workbench.supervisor.discovery import (
        OrchConfigValidator,
        RunDirectoryWatcher,
        scan_runs,
    )

    experiment = root / "cpu"
    experiment.mkdir()
    make_runs(experiment, CPU_RUNS, finished=False)
    activity = [str(experiment), str(CPU_RUNS), str(seconds + 2), str(step_every_s)]
    writer = subprocess.Popen([sys.executable, __file__, "activity", *activity])
    due = threading.Event()
    watcher = RunDirectoryWatcher(experiment, due.set)
    watcher.start()
    validator = OrchConfigValidator()
    scan_runs(experiment, validator)  # every orch.toml validated once, as long since
    rescans = event_rescans = 0
    time.sleep(1.0)  # the writer is under way
    cpu_start, start = time.process_time(), time.monotonic()
    next_rescan = start
    while (now := time.monotonic()) - start < seconds:
        due.wait(TICK_S)
        now = time.monotonic()
        by_event = due.is_set()
        if by_event or now >= next_rescan:
            due.clear()
            next_rescan = now + RESCAN_S
            watcher.sync()
            scan_runs(experiment, validator)
            rescans += 1
            event_rescans += by_event
    cpu_s = time.process_time() - cpu_start
    elapsed = time.monotonic() - start
    events = getattr(watcher, "events_seen", None)
    watcher.stop()
    writer.wait()
    return {
        "runs": CPU_RUNS,
        "step_every_s": step_every_s,
        "seconds": round(elapsed, 1),
        "cpu_s_per_minute": round(cpu_s * 60 / elapsed, 3),
        "rescans": rescans,
        "rescans_after_an_event": event_rescans,
        "events_to_handler": events,
        "events_to_handler_per_s": None if events is None else round(events / elapsed, 1),
    }


def tui_reader_cpu(root: Path, seconds: float, step_every_s: float) -> dict[str, Any]:
    """The TUI's reader polling every second (as the TUI does, leaderboard hidden), alone
    in this process, under the same activity."""
    from workbench.tui.data import ExperimentReader

    experiment = root / "tui_cpu"
    experiment.mkdir()
    make_runs(experiment, CPU_RUNS, finished=False)
    activity = [str(experiment), str(CPU_RUNS), str(seconds + 2), str(step_every_s)]
    writer = subprocess.Popen([sys.executable, __file__, "activity", *activity])
    reader = ExperimentReader(experiment, supervisor_pid=lambda _: None)
    reader.poll(rank=False)
    time.sleep(1.0)
    polls = 0
    cpu_start, start = time.process_time(), time.monotonic()
    while time.monotonic() - start < seconds:
        reader.poll(rank=False)
        polls += 1
        time.sleep(max(0.0, start + polls - time.monotonic()))
    cpu_s = time.process_time() - cpu_start
    elapsed = time.monotonic() - start
    reader.close()
    writer.wait()
    return {
        "runs": CPU_RUNS,
        "step_every_s": step_every_s,
        "polls": polls,
        "cpu_s_per_minute": round(cpu_s * 60 / elapsed, 3),
    }


# ---------------------------------------------------------------- one tree


def measure_tree(variant: str, seconds: float, step_every_s: float, trials: int) -> dict:
    """Everything for the `workbench` this process imports (see the module docstring)."""
    from workbench.bench.supervisor import latency_summary, measure_discovery

    if variant in RECURSIVE_VARIANTS:
        use_a_recursive_schedule(filtered=variant == "recursive-schedule")
    with tempfile.TemporaryDirectory(prefix="bench-discovery-") as tmp:
        root = Path(tmp)
        result: dict[str, Any] = {"variant": variant}
        say(f"[{variant}] discovery CPU at {CPU_RUNS} active runs for {seconds:.0f} s")
        result["discovery_cpu"] = discovery_cpu(root, seconds, step_every_s)
        if variant in RECURSIVE_VARIANTS:
            return result
        say(f"[{variant}] the TUI reader's CPU at {CPU_RUNS} active runs")
        result["tui_reader_cpu"] = tui_reader_cpu(root, seconds, step_every_s)
        result["supervisor"] = {}
        result["tui_reader"] = {}
        for runs in RUN_COUNTS:
            say(f"[{variant}] threads at {runs} runs")
            result["supervisor"][runs] = supervisor_threads(root, runs)
            result["tui_reader"][runs] = tui_reader_threads(root, runs)
        say(f"[{variant}] discovery latency, {trials} trials per way of making a run")
        latency = measure_discovery(root, trials, say)
        result["discovery_latency"] = {
            "spawned": latency_summary([s["spawned_ms"] for s in latency["samples"]]),
            "in_state_json": latency_summary([s["visible_ms"] for s in latency["samples"]]),
            "per_mode": latency["modes"],
        }
        if variant == "this-tree":
            result["per_directory_schedules"] = {
                runs: per_directory_schedule_threads(root, runs) for runs in RUN_COUNTS
            }
    return result


RECURSIVE_VARIANTS = ("recursive-schedule", "recursive-no-event-filter")


def use_a_recursive_schedule(*, filtered: bool) -> None:
    """Discovery as it would be with one recursive schedule of the experiment (the other
    design): every directory below it watched, with the TUI feed's event filter (made,
    closed after writing, renamed, deleted) or none (watchdog's default: every kind)."""
    from workbench.files import experiment_changes
    from workbench.supervisor import discovery
    from workbench.system import tree_events

    follow_tree = tree_events.follow_tree

    def follow_recursively(root, on_event, event_types, who, *, recursive=False):
        kinds = experiment_changes.WATCHED_EVENTS if filtered else None
        return follow_tree(root, on_event, kinds, who, recursive=True)

    discovery.tree_events.follow_tree = follow_recursively  # type: ignore[assignment]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_tree(tree: Path, variant: str, seconds: float, step_every_s: float, trials: int) -> dict:
    """`measure_tree` in a child process whose `workbench` (and its children's) is `tree`;
    this file is copied out so that the child imports nothing from this tree."""
    with tempfile.TemporaryDirectory(prefix="bench-discovery-script-") as tmp:
        script = Path(tmp) / "discovery_bench.py"
        shutil.copy(__file__, script)
        env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
        argv = [sys.executable, str(script), "measure", variant]
        argv += [str(seconds), str(step_every_s), str(trials)]
        done = subprocess.run(argv, env=env, cwd=tree, stdout=subprocess.PIPE, check=True)
    return json.loads(done.stdout)


def compare(
    baseline: Path, seconds: float = 60.0, step_every_s: float = 10.0, trials: int = 10
) -> dict[str, Any]:
    """The baseline tree, this tree, and this tree's discovery on a recursive schedule
    (with and without an event filter)."""
    this_tree = Path(__file__).resolve().parents[2]
    return {
        "this_tree": {"path": str(this_tree), "commit": _commit(this_tree)},
        "baseline_tree": {"path": str(baseline.resolve()), "commit": _commit(baseline)},
        "results": [
            run_tree(baseline, "baseline", seconds, step_every_s, trials),
            run_tree(this_tree, "this-tree", seconds, step_every_s, trials),
            run_tree(this_tree, "recursive-schedule", seconds, step_every_s, trials),
            run_tree(this_tree, "recursive-no-event-filter", seconds, step_every_s, trials),
        ],
    }


def _commit(tree: Path) -> str:
    """The tree's commit, short, and whether files beside it were edited (`results.code`)."""
    from workbench.bench.results import code  # not in the measured children's imports

    state = code(tree)
    edited = " (uncommitted changes)" if state.get("edited") else ""
    return state.get("commit", "")[:12] + edited


if __name__ == "__main__":  # the child processes of `run_tree` and `discovery_cpu`
    command, *args = sys.argv[1:]
    if command == "activity":
        write_activity(Path(args[0]), int(args[1]), float(args[2]), float(args[3]))
    elif command == "measure":
        outcome = measure_tree(args[0], float(args[1]), float(args[2]), int(args[3]))
        print(json.dumps(outcome))
    else:
        raise SystemExit(f"unknown command {command!r}")
