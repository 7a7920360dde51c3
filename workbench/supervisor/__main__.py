"""Entry of the supervisor daemon: `python -m workbench.supervisor --experiment DIR`.

Started by `workbench up` (see `workbench.supervisor.launch.start_daemon`) in its own
session, with its output appended to `logs/supervisor.log`. Exit codes: 0 stopped
normally, 2 the plan failed (bad recipe, port in use), 3 another supervisor already runs
for the experiment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workbench.supervisor.daemon import run_daemon
from workbench.supervisor.plan import DEFAULT_PLAN
from workbench.system.priority import run_as_batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workbench.supervisor",
        description="Supervise one experiment: inference, trainer, one orchestrator per run.",
    )
    parser.add_argument("--experiment", type=Path, required=True, help="experiment directory")
    parser.add_argument(
        "--exit-when-done",
        action="store_true",
        help="stop everything and exit once every run is finished, evicted, rejected or failed",
    )
    parser.add_argument(
        "--plan",
        default=DEFAULT_PLAN,
        help="MODULE:FUNCTION or FILE.py:FUNCTION building the processes (tests use stand-ins)",
    )
    args = parser.parse_args(argv)
    # `up` has done it already; a supervisor started otherwise in a session of its own gets
    # it too, for the orchestrators share its session (`workbench.system.priority`).
    run_as_batch()
    return run_daemon(args.experiment, plan=args.plan, exit_when_done=args.exit_when_done)


if __name__ == "__main__":
    sys.exit(main())
