"""The real plan's children stop when the supervisor is killed with SIGKILL.

They run in sessions or process groups of their own (a closed terminal must not reach
them), so nothing else would stop them: they would train and generate on, unsupervised,
until someone ran `workbench down`. The supervisor here is a stand-in parent that builds the real plan and
spawns its trainer and an orchestrator exactly as the daemon does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.helpers import autogroup_nice, make_run
from workbench.files import layout
from workbench.system.procfs import child_pids, process_is_alive

PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from workbench.supervisor.plan import plan_from_recipe
    from workbench.supervisor.process import SupervisedProcess
    from workbench.system.priority import run_as_batch

    run_as_batch()  # as the daemon does, in its session of its own
    experiment = Path(sys.argv[1])
    plan = plan_from_recipe(experiment)
    trainer = plan.processes[1]
    for spec in (trainer, plan.orchestrator("run_a", experiment / "run_a")):
        process = SupervisedProcess(spec)
        assert process.spawn(time.monotonic()) is None
        print(process.pid, flush=True)
    time.sleep(3600)
    """
)
RECIPE = '[model]\nbase = "builtin:tiny-reverse"\n'


def wait(condition, timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)
    return bool(condition())


def start_children(tmp_path: Path, env: dict[str, str] | None = None):
    """The stand-in supervisor and the pids of the trainer and run_a's orchestrator it started."""
    experiment = tmp_path / "exp"
    experiment.mkdir()
    layout.recipe_path(experiment).write_text(RECIPE)
    make_run(experiment, "run_a")
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(experiment)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # as `up` starts the daemon: the orchestrators share it
    )
    return parent, [int(parent.stdout.readline()), int(parent.stdout.readline())]


def test_the_trainer_its_worker_and_orchestrators_stop_when_the_supervisor_is_killed(
    tmp_path: Path,
):
    parent, children = start_children(tmp_path)
    trainer = children[0]
    try:
        assert wait(lambda: child_pids(trainer)), "torchrun started no worker"
        family = [*children, *child_pids(trainer)]
        parent.kill()
        parent.wait()
        assert wait(lambda: not any(process_is_alive(pid) for pid in family)), [
            pid for pid in family if process_is_alive(pid)
        ]
    finally:
        parent.kill()
        for pid in [*children, *child_pids(trainer)]:
            if process_is_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_trainer_its_worker_and_orchestrators_run_as_batch_work_and_the_user_does_not(
    tmp_path: Path,
):
    mine = (os.getpriority(os.PRIO_PROCESS, 0), autogroup_nice(os.getpid()))
    parent, children = start_children(tmp_path, {"WORKBENCH_NICE": "7"})
    trainer = children[0]
    try:
        assert wait(lambda: child_pids(trainer)), "torchrun started no worker"
        # The agent, its worker (a session of its own) and the orchestrator.
        family = [*children, *child_pids(trainer)]

        def batch(pid: int) -> bool:  # a value already higher (a niced test run) is kept
            group = autogroup_nice(pid)
            return os.getpriority(os.PRIO_PROCESS, pid) >= 7 and (group is None or group >= 7)

        assert wait(lambda: all(batch(pid) for pid in family)), {
            pid: (os.getpriority(os.PRIO_PROCESS, pid), autogroup_nice(pid)) for pid in family
        }
        # The orchestrator leads its group in the supervisor's session: runs add no
        # session, so no share of the CPU against the TUI's; the trainer has its own.
        orchestrator = children[1]
        assert os.getpgid(orchestrator) == orchestrator
        assert os.getsid(orchestrator) == parent.pid != os.getsid(trainer)
        # This process stands for the user's terminal (the TUI, a shell): untouched.
        assert (os.getpriority(os.PRIO_PROCESS, 0), autogroup_nice(os.getpid())) == mine
    finally:
        parent.kill()
        parent.wait()
        for pid in [*children, *child_pids(trainer)]:
            if process_is_alive(pid):
                os.kill(pid, signal.SIGKILL)
