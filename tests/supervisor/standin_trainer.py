"""A stand-in trainer for supervisor tests: the real slot bookkeeping, no model.

It runs `MultiRunManager` exactly as the trainer's loop does (discover, then
synchronise, which publishes `trainer/runs.json`) every `--interval` seconds, so tests
see runs take slots, wait for one, and get one when a run is evicted, without torch
doing any training. Exits on SIGTERM, as the real trainer does after its checkpoints.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from workbench.trainer.runs.manager import MultiRunManager


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--experiment", type=Path, required=True)
    parser.add_argument("--max-runs", type=int, required=True)
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    manager = MultiRunManager(args.experiment, args.max_runs)
    print(f"stand-in trainer with {args.max_runs} slots", flush=True)
    while True:
        manager.discover_runs()
        manager.synchronize_state()
        time.sleep(args.interval)


if __name__ == "__main__":
    main()
