"""One real experiment driven the way a user drives it: the CLI, the experiment directory.

`FaultExperiment` writes a small recipe (the shipped task and model, two runs, few steps,
frequent checkpoints; or the recipe it is given, as the load benchmark does) into a scratch
directory, starts it with `workbench up --headless --detach` (the supervisor then stops by
itself once every run is done), and watches every
process that belongs to it: the supervisor's descendants, polled twice a second, so that
processes a killed supervisor left behind are still known. `down` stops it and counts
what is still alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import tomlkit

from workbench.files import layout, run_control
from workbench.supervisor.client import read_state

RECIPE = """\
[experiment]
name = "faults"
output_dir = "outputs/faults"

[model]
base = "builtin:tiny-reverse"

[inference]
max_loras = 4

[trainer]
max_concurrent_runs = 4
lora = {{ rank = 8, alpha = 16 }}

[defaults]
env = "reverse_text"
env_args = {{ min_length = 9, max_length = 9 }}
max_steps = {max_steps}
batch_size = 64
rollouts_per_prompt = 8
lr = 3e-3
async_level = 1
checkpoint_interval = {checkpoint_interval}
eval = {{ interval = 0 }}

[[runs]]
id = "a"

[[runs]]
id = "b"
lr = 5e-3
"""
RUN_IDS = ("run_a", "run_b")


@dataclass(frozen=True)
class Seen:
    pid: int
    created: float
    command: str


def still_alive(seen: Seen) -> bool:
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(seen.pid)
        return process.create_time() == seen.created and process.status() != "zombie"
    return False


@dataclass
class FaultExperiment:
    scratch: Path
    max_steps: int
    checkpoint_interval: int
    # The recipe to start; by default RECIPE with `max_steps` and `checkpoint_interval`.
    recipe_text: str = ""
    seen: dict[tuple[int, float], Seen] = field(default_factory=dict)
    cli_lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.recipe = self.scratch / "recipe.toml"
        text = self.recipe_text or RECIPE.format(
            max_steps=self.max_steps, checkpoint_interval=self.checkpoint_interval
        )
        self.recipe.write_text(text)
        # Relative to the scratch directory, where every command runs.
        self.path = self.scratch / tomlkit.parse(text)["experiment"]["output_dir"]
        self._stop_watch = threading.Event()
        self._watch: threading.Thread | None = None

    # -------------------------------------------------------------- the CLI

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "workbench.cli", *args],
            cwd=self.scratch,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:  # a failing command is worth a note in the report
            shown = " ".join(_shortened(arg) for arg in args)
            self.cli_lines.append(f"$ workbench {shown} -> {result.returncode}")
            self.cli_lines += [
                _shortened(line)
                for line in (result.stdout + result.stderr).strip().splitlines()[-4:]
            ]
        return result

    def up(self) -> subprocess.CompletedProcess[str]:
        result = self.cli("up", str(self.recipe), "--headless", "--detach")
        self.start_watching()
        return result

    def down(self) -> subprocess.CompletedProcess[str]:
        return self.cli("down", str(self.path), timeout=400)

    # -------------------------------------------------------------- processes

    def state(self) -> dict[str, Any]:
        return read_state(self.path) or {}

    def supervisor_pid(self) -> int | None:
        pid = self.state().get("pid")
        return pid if isinstance(pid, int) and psutil.pid_exists(pid) else None

    def child_pid(self, name: str) -> int | None:
        record = (self.state().get("processes") or {}).get(name) or {}
        pid = record.get("pid")
        return pid if isinstance(pid, int) else None

    def process_state(self, name: str) -> str | None:
        record = (self.state().get("processes") or {}).get(name) or {}
        return record.get("state")

    def trainer_workers(self) -> list[int]:
        pid = self.child_pid("trainer")
        if pid is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [child.pid for child in psutil.Process(pid).children()]
        return []

    def start_watching(self) -> None:
        if self._watch is None:
            self._watch = threading.Thread(target=self._watch_loop, daemon=True)
            self._watch.start()

    def _watch_loop(self) -> None:
        while not self._stop_watch.wait(0.5):
            self.record_processes()

    def record_processes(self) -> None:
        """Remember the supervisor and its descendants, and anything whose command line
        names this experiment (vLLM's server does not; the descendants catch it)."""
        roots = [self.supervisor_pid()]
        roots += [
            record.get("pid")
            for record in (self.state().get("processes") or {}).values()
            if isinstance(record, dict)
        ]
        # The supervisor first: its descendants are most of the roots, and each walk of
        # a process tree reads all of /proc (many runs make many roots).
        found: set[int] = set()
        for pid in dict.fromkeys(p for p in roots if isinstance(p, int)):
            if pid in found:
                continue
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                for member in [process, *process.children(recursive=True)]:
                    found.add(member.pid)
                    self._remember(member)

    def _remember(self, process: psutil.Process) -> None:
        with contextlib.suppress(psutil.Error):
            seen = Seen(process.pid, process.create_time(), " ".join(process.cmdline()[:6]))
            self.seen.setdefault((seen.pid, seen.created), seen)

    def alive(self) -> list[Seen]:
        """Processes of this experiment still running: any seen one, or any whose command
        line names the experiment directory."""
        alive = [seen for seen in self.seen.values() if still_alive(seen)]
        known = {seen.pid for seen in alive}
        marker = str(self.path)
        for process in psutil.process_iter(["pid", "cmdline"]):
            with contextlib.suppress(psutil.Error, TypeError):
                if process.pid not in known and marker in " ".join(process.info["cmdline"]):
                    alive.append(Seen(process.pid, process.create_time(), marker))
        return alive

    def kill_leftovers(self) -> None:
        """The benchmark's own clean-up after counting: nothing of it may outlive it."""
        self._stop_watch.set()
        for seen in self.alive():
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                os.kill(seen.pid, signal.SIGKILL)

    # -------------------------------------------------------------- runs

    def trained_step(self, run_id: str) -> int:
        return layout.latest_stable_step(layout.broadcasts_dir(self.path / run_id)) or 0

    def finished(self, run_id: str) -> bool:
        return run_control.is_finished(self.path / run_id)

    def wait(self, condition, timeout_s: float, poll_s: float = 0.2) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(poll_s)
        return bool(condition())

    def wait_until_done(self, runs: tuple[str, ...], timeout_s: float) -> bool:
        """Every run in `runs` finished, or the supervisor stopped (by itself once every
        run is done, or giving up)."""
        self.wait(
            lambda: all(self.finished(run) for run in runs) or self.supervisor_pid() is None,
            timeout_s,
            1.0,
        )
        return all(self.finished(run) for run in runs)


def _shortened(text: str, limit: int = 200) -> str:
    """A note as the report shows it: the security scenario's 10,000-character run id
    would fill the table."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
