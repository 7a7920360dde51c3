"""A stand-in for a supervised child (inference, trainer, orchestrator), for the supervisor's
tests and benchmark (`standins.py` runs it); it trains nothing.

Real children need vLLM, torch and minutes; the supervisor only cares how a process
starts, announces readiness, exits and reacts to signals. This script does exactly that,
steered by flags, and appends what happens to an events file (one `write` per line, so
lines from several processes never interleave):

    <unix time> <name> start <pid>
    <unix time> <name> ready | crash <code> | sigterm | finished

Startup can be held where a test looks at it: `--build-steps N --build-until FILE` reports
N steps of a model build the way a real child does (`model_build.json`), then holds at the
last until FILE exists; `--say LINE` prints lines to its log; `--ready-when FILE` holds
readiness until FILE exists.

An orchestrator stand-in given `--write-metrics` appends the values of
`{run_dir}/standin_metrics.json` (`{"metric", "values", "interval_s"}`) to the run's
metrics.jsonl, one step per interval, and, like a real orchestrator waiting for the
trainer's adapters, only while the trainer holds a slot for its run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def event(events: Path, text: str) -> None:
    fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{time.time():.3f} {text}\n".encode())
    finally:
        os.close(fd)


def next_attempt(counter: Path) -> int:
    attempt = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(attempt))
    return attempt


def holds_slot(run_dir: Path) -> bool:
    try:
        state = json.loads((run_dir.parent / "trainer" / "runs.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return run_dir.name in state.get("slots", {}).values()


def write_metrics(run_dir: Path) -> None:
    from workbench.files.metrics import append_metrics

    plan = json.loads((run_dir / "standin_metrics.json").read_text())
    for step, value in enumerate(plan["values"]):
        while not holds_slot(run_dir):
            time.sleep(0.02)
        append_metrics(run_dir, "eval", step, **{plan["metric"]: value})
        time.sleep(plan["interval_s"])


def wait_for_file(path: Path) -> None:
    while not path.exists():
        time.sleep(0.02)


def build_model(experiment: Path, steps: int, until: Path) -> None:
    from workbench.models.build_progress import BuildProgressFile

    with BuildProgressFile(experiment, "builtin:stand-in") as on_step:
        for step in range(1, steps + 1):
            on_step(step, steps, f"stand-in step {step} of {steps}")
        wait_for_file(until)


def main() -> None:
    args = _parse_args()
    _handle_sigterm(args)
    # Announced once signals are handled: a test that saw "start" may send SIGTERM.
    event(args.events, f"{args.name} start {os.getpid()}")
    print(f"stand-in {args.name} started (pid {os.getpid()})", flush=True)

    if args.grandchild_pid_file:
        grandchild = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=False
        )
        args.grandchild_pid_file.write_text(str(grandchild.pid))

    counter = args.events.with_name(f"{args.name}.attempts")
    if next_attempt(counter) <= args.crash_times:
        time.sleep(args.crash_after)
        print(f"stand-in {args.name} crashing with exit code {args.crash_code}", flush=True)
        event(args.events, f"{args.name} crash {args.crash_code}")
        sys.exit(args.crash_code)

    if args.build_steps:
        build_model(args.experiment, args.build_steps, args.build_until)
    for line in args.say:
        print(line, flush=True)
    if args.ready_file:
        _become_ready(args)
    if args.write_metrics and args.run_dir is not None:
        write_metrics(args.run_dir)

    if args.finish_after is not None and args.run_dir is not None:
        time.sleep(args.finish_after)
        from workbench.files.run_control import mark_finished

        mark_finished(args.run_dir, step=1)
        event(args.events, f"{args.name} finished")
        sys.exit(0)

    while True:
        time.sleep(0.1)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path, help="created once ready")
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--crash-times", type=int, default=0, help="crash on the first N starts")
    parser.add_argument("--crash-code", type=int, default=3)
    parser.add_argument("--crash-after", type=float, default=0.1)
    parser.add_argument("--grandchild-pid-file", type=Path, help="spawn a sleeping grandchild")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--run-dir", type=Path, help="orchestrator stand-ins: the run")
    parser.add_argument("--finish-after", type=float, help="mark the run finished, exit 0")
    parser.add_argument("--write-metrics", action="store_true", help="see the docstring")
    parser.add_argument("--experiment", type=Path, help="where a stand-in build reports")
    parser.add_argument("--build-steps", type=int, default=0, help="report a model build")
    parser.add_argument("--build-until", type=Path, help="hold the build until this exists")
    parser.add_argument("--say", action="append", default=[], help="print this line")
    parser.add_argument("--ready-when", type=Path, help="hold readiness until this exists")
    args = parser.parse_args()
    if args.build_steps and (args.experiment is None or args.build_until is None):
        parser.error("--build-steps needs --experiment and --build-until")
    return args


def _handle_sigterm(args: argparse.Namespace) -> None:
    """Ignore SIGTERM when asked; else record it and exit 0."""
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return

    def on_sigterm(_signum: int, _frame: object) -> None:
        event(args.events, f"{args.name} sigterm")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)


def _become_ready(args: argparse.Namespace) -> None:
    """Create the ready file after --ready-after seconds and, if given, once --ready-when
    exists."""
    time.sleep(args.ready_after)
    if args.ready_when is not None:
        wait_for_file(args.ready_when)
    args.ready_file.parent.mkdir(parents=True, exist_ok=True)
    args.ready_file.touch()
    event(args.events, f"{args.name} ready")


if __name__ == "__main__":
    main()
