"""The faults: one function each, injected into a running `FaultExperiment`.

A scenario's `inject` runs at a moment drawn from the seed (a random step of run_a, then
a random fraction of a second) unless it is `at_start` (the fault must meet the start of
the experiment: a port taken, memory held). `setup` runs before `workbench up`, `teardown`
after `down` and the checks. Each writes what it did into the `Injection` it is given:
how many faults it injected, paths it planted on purpose (not counted as half-written
files by the checks), the runs expected to finish, and notes for the report.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any

import psutil

from workbench.bench.faults.experiment import RUN_IDS, FaultExperiment, still_alive
from workbench.bench.faults.security import security_problems
from workbench.files import layout
from workbench.files.endpoint import read_endpoint


@dataclass
class Injection:
    exp: FaultExperiment
    rng: Random
    injected: int = 0
    at: float | None = None  # wall-clock time of the (first) injection
    planted: set[Path] = field(default_factory=set)
    expect_finished: tuple[str, ...] = RUN_IDS
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # Latest checkpoint step of each run when `up` ran again: what it must resume from.
    resume_from: dict[str, int] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)  # runs whose directory was removed

    def mark(self) -> None:
        self.injected += 1
        if self.at is None:
            self.at = time.time()


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    inject: Callable[[Injection], None]
    at_start: bool = False
    setup: Callable[[Injection], None] | None = None
    teardown: Callable[[Injection], None] | None = None


def sigkill(inj: Injection, pid: int | None, what: str) -> None:
    if pid is None:
        inj.notes.append(f"no {what} process to kill")
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
        inj.mark()


# ---------------------------------------------------------------- processes killed


def kill_inference(inj: Injection) -> None:
    sigkill(inj, inj.exp.child_pid("inference"), "inference")


def kill_trainer_worker(inj: Injection) -> None:
    workers = inj.exp.trainer_workers()
    sigkill(inj, workers[0] if workers else None, "trainer worker")


def kill_torchrun_agent(inj: Injection) -> None:
    sigkill(inj, inj.exp.child_pid("trainer"), "torchrun agent")


def kill_orchestrator(inj: Injection) -> None:
    run_id = inj.rng.choice(RUN_IDS)
    sigkill(inj, inj.exp.child_pid(run_id), f"{run_id} orchestrator")


def _every_child(exp: FaultExperiment) -> list[int]:
    pids = [exp.child_pid(name) for name in ("inference", "trainer", *RUN_IDS)]
    return [pid for pid in [*pids, *exp.trainer_workers()] if pid is not None]


def kill_every_child(inj: Injection) -> None:
    for pid in _every_child(inj.exp):
        sigkill(inj, pid, "child")


def _checkpoint_steps(exp: FaultExperiment) -> dict[str, int]:
    return {
        run: layout.latest_checkpoint_step(exp.path / run, "trainer") or 0
        for run in RUN_IDS
        if not exp.finished(run)
    }


def _up_again(inj: Injection) -> None:
    exp = inj.exp
    inj.resume_from = _checkpoint_steps(exp)
    status = exp.cli("status", str(exp.path))
    inj.notes.append(f"status without a supervisor: exit {status.returncode}")
    result = exp.up()
    inj.notes.append(f"up again: exit {result.returncode}")


def kill_supervisor(inj: Injection) -> None:
    """SIGKILL the supervisor alone: its children must stop by themselves (they die with
    it), then `up` on the same experiment resumes every run."""
    exp = inj.exp
    exp.record_processes()
    children = [seen for seen in exp.seen.values() if seen.pid != exp.supervisor_pid()]
    sigkill(inj, exp.supervisor_pid(), "supervisor")
    started = time.monotonic()
    gone = exp.wait(lambda: not any(still_alive(seen) for seen in children), 120, 0.2)
    waited = time.monotonic() - started
    inj.extra["children_gone_s"] = round(waited, 1) if gone else None
    survivors = [f"{seen.pid} {seen.command[:80]}" for seen in children if still_alive(seen)]
    inj.notes.append(
        f"children stopped by themselves {waited:.1f}s after the supervisor died"
        if gone
        else f"still running 120s after the supervisor died: {'; '.join(survivors)}"
    )
    _up_again(inj)


def kill_supervisor_then_down(inj: Injection) -> None:
    """SIGKILL the supervisor, then `workbench down`: nothing of the experiment may be left."""
    exp = inj.exp
    exp.record_processes()
    sigkill(inj, exp.supervisor_pid(), "supervisor")
    inj.expect_finished = ()
    result = exp.down()
    inj.notes.append(f"down after the supervisor was killed: exit {result.returncode}")


def machine_restart(inj: Injection) -> None:
    """SIGKILL of every process of the experiment at once, then `up`: each run resumes
    from its latest STABLE checkpoint."""
    exp = inj.exp
    exp.record_processes()
    for seen in list(exp.seen.values()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(seen.pid, signal.SIGKILL)
    inj.mark()
    time.sleep(1.0)
    _up_again(inj)


# ---------------------------------------------------------------- checkpoints


def _signal_during_checkpoint(inj: Injection, sig: int) -> None:
    """Wait for a trainer checkpoint being staged (`checkpoints/step_N/.trainer.*.tmp`)
    and signal the trainer's worker while it is there."""
    exp = inj.exp
    roots = [layout.checkpoints_dir(exp.path / run) for run in RUN_IDS]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        staging = [p for root in roots if root.is_dir() for p in root.glob("step_*/.trainer.*.tmp")]
        if staging:
            workers = exp.trainer_workers()
            if workers:
                os.kill(workers[0], sig)
                inj.mark()
                files = sorted(p.name for p in staging[0].rglob("*") if p.is_file())
                inj.notes.append(f"hit {staging[0].name} holding {files}")
                return
        time.sleep(0.002)
    inj.notes.append("no checkpoint was being written within 300s")


def sigterm_during_checkpoint(inj: Injection) -> None:
    _signal_during_checkpoint(inj, signal.SIGTERM)


def sigkill_during_checkpoint(inj: Injection) -> None:
    _signal_during_checkpoint(inj, signal.SIGKILL)


def checkpoint_without_stable(inj: Injection) -> None:
    """A newer checkpoint with no STABLE (a copy cut short), then a trainer restart: it
    must resume from the latest complete one."""
    exp = inj.exp
    run = exp.path / "run_a"
    if not exp.wait(lambda: layout.latest_checkpoint_step(run, "trainer"), 300):
        inj.notes.append("run_a wrote no checkpoint to fall back on")
        return
    part = layout.checkpoint_part_dir(run, exp.max_steps + 100, "trainer")
    part.mkdir(parents=True)
    (part / "adapter.safetensors").write_bytes(b"\0" * 100)
    (part / "progress.json").write_text('{"step": ')
    inj.planted.add(part)
    kill_trainer_worker(inj)
    inj.resume_from = _checkpoint_steps(exp)  # SIGKILL: nothing is written after it


# ---------------------------------------------------------------- run directories


def remove_tree(path: Path, attempts: int = 20) -> None:
    """`rm -rf` that wins against a writer: the trainer may add a file to the run (a
    checkpoint) while the tree is being removed, which fails that removal with ENOTEMPTY;
    a user would run it again, so this does."""
    for attempt in range(attempts):
        try:
            shutil.rmtree(path)
            return
        except OSError as err:
            if not path.exists():
                return
            # A file added (ENOTEMPTY) or removed (ENOENT) by the writer meanwhile.
            if err.errno not in (errno.ENOTEMPTY, errno.ENOENT) or attempt == attempts - 1:
                raise
            time.sleep(0.05)


def delete_run_dir(inj: Injection) -> None:
    exp = inj.exp
    remove_tree(exp.path / "run_b")
    inj.deleted.add("run_b")
    inj.mark()
    inj.expect_finished = ("run_a",)


def garbage_orch_toml(inj: Injection) -> None:
    """Garbage in run_b's control/orch.toml: the run stops with a reason; once the file
    is put back it goes on."""
    exp = inj.exp
    path = layout.orch_config_path(exp.path / "run_b")
    original = path.read_text()
    layout.atomic_write_text(path, "max_steps = [[[ not toml\n\0\x01")
    inj.mark()
    held = exp.wait(lambda: exp.process_state("run_b") in ("stopped", "failed"), 60)
    reason = ((exp.state().get("processes") or {}).get("run_b") or {}).get("reason")
    inj.notes.append(f"run_b {'stopped' if held else 'NOT stopped'}: {reason}")
    layout.atomic_write_text(path, original)


def truncated_rollouts(inj: Injection) -> None:
    """A rollout step ahead of the orchestrator, cut short and without STABLE: the trainer
    must not read it, and the orchestrator writes the real one over it."""
    exp = inj.exp
    run = exp.path / "run_a"
    step = (layout.latest_stable_step(layout.rollouts_dir(run)) or 0) + 2
    directory = layout.rollout_dir(run, step)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rollouts.jsonl").write_text('{"prompt": "abc", "completion": "c')
    inj.planted.add(directory)
    inj.mark()


def security_checks(inj: Injection) -> None:
    """Not a fault: the security checks, on the running experiment."""
    problems = security_problems(inj.exp)
    inj.mark()
    inj.extra["security_problems"] = len(problems)
    inj.notes += problems or ["security: every check passed"]


# ---------------------------------------------------------------- the machine


FILLER = "disk-filler.bin"


def mount_small_disk(inj: Injection) -> None:
    outputs = inj.exp.scratch / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=400m", "tmpfs", str(outputs)],
        capture_output=True,
        text=True,
    )
    if result.returncode == 0:
        inj.extra["mounted"] = outputs
        inj.notes.append("experiment on a 400 MB tmpfs")
    else:
        inj.notes.append(
            f"cannot mount a tmpfs ({result.stderr.strip()}): the disk is filled as it is"
        )


def fill_disk(inj: Injection) -> None:
    """Fill the experiment's filesystem to ENOSPC, hold it full for 10 s, free it."""
    filler = inj.exp.path / FILLER
    if "mounted" not in inj.extra:
        inj.notes.append("no small filesystem to fill: disk-full not injected")
        return
    with open(filler, "wb") as handle:
        chunk = b"\0" * (1 << 20)
        try:
            while True:
                handle.write(chunk)
        except OSError as err:
            inj.notes.append(f"disk full: {err.strerror}")
    inj.mark()
    time.sleep(10)
    filler.unlink()


def unmount_small_disk(inj: Injection) -> None:
    mounted = inj.extra.get("mounted")
    if mounted is not None:
        subprocess.run(["umount", "-l", str(mounted)], capture_output=True)


def take_inference_port(inj: Injection) -> None:
    """Listen on the port the plan chose for vLLM before vLLM binds it."""
    exp = inj.exp
    exp.wait(lambda: read_endpoint(exp.path) is not None, 60, 0.01)
    endpoint = read_endpoint(exp.path)
    if endpoint is None:
        inj.notes.append("no endpoint.json")
        return
    port = int(endpoint.base_url.rsplit(":", 1)[1].split("/")[0])
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError as err:
        sock.close()
        inj.notes.append(f"vLLM bound port {port} first ({err.strerror})")
        return
    inj.extra["socket"] = sock
    inj.mark()
    exp.wait(lambda: exp.process_state("inference") in ("ready", "failed"), 600, 0.5)
    moved = read_endpoint(exp.path)
    inj.notes.append(
        f"took {port}; inference {exp.process_state('inference')} at {moved and moved.base_url}"
    )


def release_port(inj: Injection) -> None:
    sock = inj.extra.pop("socket", None)
    if sock is not None:
        sock.close()


HOG = """
import sys, time
size = int(sys.argv[1])
block = bytearray(size)
for i in range(0, size, 4096):
    block[i] = 1
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold_memory(inj: Injection) -> None:
    """Hold RAM until a quarter of it is available, as a neighbour might, while vLLM starts;
    released as soon as inference is ready or failed (other experiments share the box)."""
    memory = psutil.virtual_memory()
    size = max(0, memory.available - memory.total // 4)
    hog = subprocess.Popen(
        [sys.executable, "-c", HOG, str(size), "300"], stdout=subprocess.PIPE, text=True
    )
    hog.stdout.readline()  # type: ignore[union-attr]
    inj.extra["hog"] = hog
    inj.mark()
    inj.notes.append(
        f"held {size / 2**30:.1f} of {memory.total / 2**30:.1f} GiB; "
        f"{psutil.virtual_memory().available / 2**30:.1f} GiB available at `up`"
    )


def memory_outcome(inj: Injection) -> None:
    exp = inj.exp
    exp.wait(lambda: exp.process_state("inference") in ("ready", "failed", "backoff"), 600, 0.5)
    record = (exp.state().get("processes") or {}).get("inference") or {}
    inj.notes.append(
        f"inference under pressure: {record.get('state')} {record.get('reason') or ''}"
    )
    release_memory(inj)


def release_memory(inj: Injection) -> None:
    hog = inj.extra.pop("hog", None)
    if hog is not None:
        hog.kill()
        hog.wait()


SCENARIOS = [
    Scenario("kill-inference", "SIGKILL of vLLM's server", kill_inference),
    Scenario("kill-trainer-worker", "SIGKILL of the trainer's worker", kill_trainer_worker),
    Scenario("kill-torchrun-agent", "SIGKILL of the torchrun agent", kill_torchrun_agent),
    Scenario("kill-orchestrator", "SIGKILL of one orchestrator", kill_orchestrator),
    Scenario("kill-every-child", "SIGKILL of every child at once", kill_every_child),
    Scenario("kill-supervisor", "SIGKILL of the supervisor, then up", kill_supervisor),
    Scenario(
        "kill-supervisor-down", "SIGKILL of the supervisor, then down", kill_supervisor_then_down
    ),
    Scenario(
        "sigterm-in-checkpoint", "SIGTERM to the trainer mid-checkpoint", sigterm_during_checkpoint
    ),
    Scenario(
        "sigkill-in-checkpoint", "SIGKILL of the trainer mid-checkpoint", sigkill_during_checkpoint
    ),
    Scenario("delete-run-dir", "a run directory deleted mid-step", delete_run_dir),
    Scenario("garbage-orch-toml", "control/orch.toml replaced with garbage", garbage_orch_toml),
    Scenario("truncated-rollouts", "rollouts/step_N cut short, no STABLE", truncated_rollouts),
    Scenario(
        "checkpoint-no-stable",
        "a newer checkpoint without STABLE, then a trainer restart",
        checkpoint_without_stable,
    ),
    Scenario(
        "disk-full",
        "the experiment's disk full for 10 s",
        fill_disk,
        setup=mount_small_disk,
        teardown=unmount_small_disk,
    ),
    Scenario(
        "port-taken",
        "the inference port taken before vLLM binds it",
        take_inference_port,
        at_start=True,
        teardown=release_port,
    ),
    Scenario(
        "memory-pressure",
        "three quarters of the RAM held while vLLM starts",
        memory_outcome,
        at_start=True,
        setup=hold_memory,
        teardown=release_memory,
    ),
    Scenario("machine-restart", "SIGKILL of the whole tree, then up", machine_restart),
    Scenario("security", "listeners, API key, file modes, run ids", security_checks),
]
QUICK = (
    "kill-orchestrator",
    "kill-trainer-worker",
    "sigterm-in-checkpoint",
    "delete-run-dir",
    "kill-supervisor",
)
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}
