"""The load's background work, in a child process: the churn and the watch on the slots.

A user's runs are written by other processes than the TUI's; so are the benchmark's. In
the benchmark's own process the churn's requests and, above all, the slot watch (every
run's status every 2 s) held the interpreter the TUI's event loop runs on, and were
counted in its key-to-screen latency. Here they run in a process of their own:

    python -m workbench.bench.load.background EXPERIMENT --interval S --seed N --runs R

runs until its stdin is closed (or reaches its end), then prints its report as one JSON
object: the churn's log (`ChurnLog`) and the longest slot problem seen.
`BackgroundLoad` is the parent's side.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from random import Random
from typing import Any

from workbench.bench.load import checks
from workbench.bench.load.churn import RUNS_AT_ONCE, Churn, ChurnLog
from workbench.status import read_trainer_state, run_statuses

SLOT_SAMPLE_S = 2.0


def watch_slots(experiment: Path, stop: threading.Event) -> float:
    """The longest any one slot problem lasted between samples (a slot held by an ended
    run, or free while runs wait): how long the trainer takes to catch up."""
    first_seen: dict[str, float] = {}
    longest = 0.0
    while not stop.is_set():
        problems = checks.slot_problems(run_statuses(experiment), read_trainer_state(experiment))
        now = time.monotonic()
        keys = {problem.split(":")[0] for problem in problems}
        first_seen = {key: first_seen.get(key, now) for key in keys}
        longest = max([longest, *(now - since for since in first_seen.values())])
        stop.wait(SLOT_SAMPLE_S)
    return round(longest, 1)


class BackgroundLoad:
    """The parent's side: start the child, and stop it for its report."""

    def __init__(
        self, experiment: Path, interval_s: float, seed: int, runs_at_once: int = RUNS_AT_ONCE
    ) -> None:
        self._command = [
            sys.executable,
            "-m",
            "workbench.bench.load.background",
            str(experiment),
            "--interval",
            str(interval_s),
            "--seed",
            str(seed),
            "--runs",
            str(runs_at_once),
        ]
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def stop(self) -> tuple[ChurnLog, float]:
        """Stop the churn; what it did and the longest slot problem it saw."""
        assert self._process is not None, "start() first"
        stdout, _ = self._process.communicate(input="")
        if self._process.returncode != 0:
            raise RuntimeError(f"the background load exited {self._process.returncode}")
        report = json.loads(stdout)
        return ChurnLog(**report["churn"]), float(report["slot_problems_longest_s"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", type=Path)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=RUNS_AT_ONCE)
    args = parser.parse_args(argv)

    churn = Churn(args.experiment, args.interval, Random(args.seed), args.runs)
    stop = threading.Event()
    longest: list[float] = []
    watcher = threading.Thread(
        target=lambda: longest.append(watch_slots(args.experiment, stop)), name="slots"
    )
    churn.start()
    watcher.start()
    sys.stdin.read()  # until the parent closes it
    stop.set()
    churn.stop()
    watcher.join()
    report: dict[str, Any] = {
        "churn": dataclasses.asdict(churn.log),
        "slot_problems_longest_s": longest[0] if longest else 0.0,
    }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
