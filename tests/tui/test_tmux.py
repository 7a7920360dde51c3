"""The TUI in a real terminal: tmux runs it, `send-keys` types, `capture-pane` reads the screen.

This is what a user over SSH gets: a real pty, real key sequences, an 80x24 screen. Each
test uses its own tmux server (a private socket), so nothing the user runs is touched.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.tui.synthetic import append_log, build_experiment, build_sweep_experiment
from workbench.files import run_control

TMUX = shutil.which("tmux")


@pytest.fixture(autouse=True)
def _tmux_installed() -> None:
    # The README's test command installs it (scripts/test_system.sh): a machine without it
    # has not run that, and a skip would pass the suite without the real-terminal test.
    if TMUX is None:
        pytest.fail("tmux is not installed: run `bash scripts/test_system.sh` (as root)")


WIDTH, HEIGHT = 80, 24


class TmuxSession:
    """One detached tmux session on a private server."""

    def __init__(self, name: str) -> None:
        self.socket = f"workbench-test-{name}-{uuid.uuid4().hex[:8]}"
        self.name = "tui"

    def tmux(self, *args: str) -> str:
        result = subprocess.run(
            [TMUX or "tmux", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return result.stdout

    def start(self, command: list[str], cwd: Path) -> None:
        # After the TUI exits the pane says how, and stays readable for the test.
        shell = f"cd {shlex.quote(str(cwd))} && {shlex.join(command)}; echo TUI-EXITED=$?; sleep 60"
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
        subprocess.run(
            [
                TMUX or "tmux",
                "-L",
                self.socket,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-s",
                self.name,
                "-x",
                str(WIDTH),
                "-y",
                str(HEIGHT),
                shell,
            ],
            check=True,
            timeout=10,
            env=env,
        )

    def send(self, *keys: str) -> None:
        for key in keys:
            # One key per call: tmux would read "Escape" followed by "a" as alt+a.
            self.tmux("send-keys", "-t", self.name, key)
            time.sleep(0.15)

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", self.name, "-l", text)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.name)

    def wait_for(self, condition: Callable[[str], bool], what: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if condition(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; the screen shows:\n{screen}")

    def wait_for_text(self, text: str, timeout: float = 20) -> str:
        return self.wait_for(lambda screen: text in screen, repr(text), timeout)

    def kill(self) -> None:
        subprocess.run(
            [TMUX or "tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10
        )


@pytest.fixture
def stand_in_supervisor() -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def tmux_session(request) -> Iterator[TmuxSession]:
    session = TmuxSession(request.node.name[:20])
    yield session
    session.kill()


def test_tui_on_a_synthetic_experiment_in_a_real_80x24_terminal(
    tmp_path, stand_in_supervisor, tmux_session
):
    # The directory says a supervisor runs (state.json) but no supervisor answers: the TUI
    # says so, and everything that only needs the files still works.
    experiment = build_experiment(tmp_path, supervisor_pid=stand_in_supervisor.pid)
    repo = Path(__file__).resolve().parents[2]
    tmux_session.start([sys.executable, "-m", "workbench.tui", str(experiment)], cwd=repo)

    screen = tmux_session.wait_for(
        lambda s: "run_typo" in s and "step 12: reward" in s, "the runs table and the log"
    )
    lines = screen.splitlines()
    assert len(lines) <= HEIGHT and all(len(line) <= WIDTH for line in lines)
    assert "supervisor gone" in lines[0]
    for row in ("run_lr1e-3", "run_lr3e-4", "run_queued", "run_typo"):
        assert row in screen
    for key in (
        "e evict",
        "r restart",
        "a add",
        "f follow",
        "/ filter",
        "S stop",
        "q quit",
        "? help",
    ):
        assert key in lines[-1], f"footer lacks {key!r}: {lines[-1]!r}"

    # The followed log grows: the new line shows.
    append_log(experiment / "run_lr1e-3" / "logs" / "orchestrator.log", ["step 13: reward 0.82"])
    tmux_session.wait_for_text("step 13: reward 0.82")

    # Evict with a reason typed in the dialog.
    tmux_session.send("e")
    tmux_session.wait_for_text("Evict run_lr1e-3?")
    tmux_session.type("reward plateaued")
    tmux_session.send("Enter")
    tmux_session.wait_for(
        lambda s: any("run_lr1e-3" in line and "evicted" in line for line in s.splitlines()),
        "run_lr1e-3 shown as evicted",
    )
    assert run_control.read_eviction(experiment / "run_lr1e-3").reason == "reward plateaued"

    # Detail screen and back, help and back: all by keyboard.
    tmux_session.send("Enter")
    tmux_session.wait_for_text("eviction reason: reward plateaued")
    tmux_session.send("Escape")
    tmux_session.wait_for_text("e evict")
    tmux_session.send("?")  # the help's first key (it scrolls: later ones may be below)
    tmux_session.wait_for_text("move between the runs table")
    tmux_session.send("Escape")
    tmux_session.wait_for(lambda s: "move between the runs table" not in s, "the help to close")

    # Quit: the TUI exits cleanly and the supervisor lives on.
    tmux_session.send("q")
    tmux_session.wait_for_text("TUI-EXITED=0")
    assert stand_in_supervisor.poll() is None, "quitting the TUI must not stop the supervisor"


def test_leaderboard_in_a_real_80x24_terminal(tmp_path, tmux_session):
    experiment = build_sweep_experiment(tmp_path)
    repo = Path(__file__).resolve().parents[2]
    tmux_session.start([sys.executable, "-m", "workbench.tui", str(experiment)], cwd=repo)
    screen = tmux_session.wait_for_text("b ranks")
    assert all(len(line) <= WIDTH for line in screen.splitlines())

    tmux_session.send("b")
    screen = tmux_session.wait_for(
        lambda s: "runs by eval_reward_mean, highest first" in s and "? help" in s,
        "the leaderboard and its footer",
    )
    lines = screen.splitlines()
    assert len(lines) <= HEIGHT and all(len(line) <= WIDTH for line in lines)
    ranked = [
        ("run_lr1e-2_rank8", "0.7"),
        ("run_lr3e-3_rank4", "finished"),
        ("run_lr3e-4_rank4", "early-stop"),
        ("run_lr3e-2_rank8", "evicted"),
        ("run_lr1e-3_rank8", "waiting"),
    ]
    row_lines = [next(i for i, line in enumerate(lines) if run_id in line) for run_id, _ in ranked]
    assert row_lines == sorted(row_lines), "rows in rank order"
    for (run_id, shown), index in zip(ranked, row_lines, strict=True):
        assert shown in lines[index], f"{run_id}'s row lacks {shown!r}: {lines[index]!r}"
    for key in ("b back", "e evict", "r restart", "q quit", "? help"):
        assert key in lines[-1], f"footer lacks {key!r}: {lines[-1]!r}"

    # Down to the run early stopping stopped: its reason shows below the table.
    tmux_session.send("Down", "Down")
    tmux_session.wait_for_text("stopped early: asha rung 0 (step 5)")
    tmux_session.send("b")
    tmux_session.wait_for_text("b ranks")
    tmux_session.send("q")
    tmux_session.wait_for_text("TUI-EXITED=0")


def test_runs_filtered_selected_and_their_curves_smoothed_in_a_real_80x24_terminal(
    tmp_path, tmux_session
):
    experiment = build_sweep_experiment(tmp_path)
    repo = Path(__file__).resolve().parents[2]
    tmux_session.start([sys.executable, "-m", "workbench.tui", str(experiment)], cwd=repo)
    tmux_session.wait_for(lambda s: "run_lr3e-4_rank4" in s and "/ filter" in s, "the runs")

    # `/`, typed filter, Enter: only the rank-8 runs with lr above 2e-3 stay.
    tmux_session.send("/")
    tmux_session.wait_for_text("filter runs: id text")
    tmux_session.type("rank8 lr>2e-3")
    tmux_session.send("Enter")
    screen = tmux_session.wait_for_text("runs · /rank8 lr>2e-3: 2 of 5")
    assert "run_lr1e-2_rank8" in screen and "run_lr3e-2_rank8" in screen
    assert "run_lr3e-3_rank4" not in screen and "run_lr1e-3_rank8" not in screen

    # Space selects the run under the cursor, p pins it; its mark says both.
    tmux_session.send("Down", "Space", "p")
    screen = tmux_session.wait_for_text("2 of 5 · 1 selected")
    runs = [line for line in screen.splitlines() if "_rank" in line]
    assert "●▲" in runs[0] and "run_lr3e-2_rank8" in runs[0], runs

    # The curves show the selected run alone; s smooths them.
    tmux_session.send("c")
    tmux_session.wait_for_text("1 of 1 selected runs")
    tmux_session.send("s")
    screen = tmux_session.wait_for_text("EMA 0.6")
    assert all(len(line) <= WIDTH for line in screen.splitlines())
    assert "run_lr3e-2_rank8" in screen and "run_lr1e-2_rank8" not in screen

    # Back, Escape clears the filter: every run again, the selection kept.
    tmux_session.send("Escape")
    tmux_session.wait_for_text("/ filter")
    tmux_session.send("Escape")
    screen = tmux_session.wait_for_text("runs · 1 selected")
    assert "run_lr3e-3_rank4" in screen and "run_lr1e-3_rank8" in screen
    tmux_session.send("q")
    tmux_session.wait_for_text("TUI-EXITED=0")


RECIPE = """\
[experiment]
name = "tmux_standins"
output_dir = "{output_dir}"

[model]
base = "builtin:tiny-reverse"

[defaults]
max_steps = 5

[[runs]]
id = "a"

[[runs]]
id = "b"
"""

# The supervisor's own test plan: stand-in children instead of vLLM, torchrun and the
# orchestrators (workbench/testing/standins.py); everything else is the real thing.
STANDINS = {
    "processes": [
        {"name": "inference", "kind": "inference", "ready": True, "args": ["--ready-after", "0.2"]},
        {"name": "trainer", "kind": "trainer"},
    ],
    "orchestrator": {},
}


def _process_state(experiment: Path, name: str) -> dict:
    try:
        state = json.loads((experiment / "supervisor" / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return state.get("processes", {}).get(name) or {}


def _wait(condition: Callable[[], object], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_tui_attached_to_a_headless_experiment(tmp_path, tmux_session):
    """`workbench up --headless --detach`, then `workbench attach` in an 80x24 terminal."""
    from workbench.supervisor.client import SupervisorClient
    from workbench.supervisor.launch import PLAN_ENV, stop_experiment
    from workbench.testing import standins

    experiment = tmp_path / "exp"
    experiment.mkdir()
    (experiment / "standins.json").write_text(json.dumps(STANDINS))
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.format(output_dir=experiment))
    repo = Path(__file__).resolve().parents[2]
    cli = [sys.executable, "-m", "workbench.cli"]
    env = {**os.environ, PLAN_ENV: standins.PLAN_REFERENCE}
    subprocess.run(
        [*cli, "up", str(recipe), "--headless", "--detach"],
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        _wait(
            lambda: _process_state(experiment, "run_b").get("state") == "running",
            "the orchestrators to run",
        )
        tmux_session.start([*cli, "attach", str(experiment)], cwd=repo)
        screen = tmux_session.wait_for(
            lambda s: "supervisor running" in s and "trainer" in s and "run_b" in s,
            "the TUI showing the running experiment",
        )
        assert "inference" in screen

        # Evict run_b through the dialog: the file has the reason, the supervisor stops
        # the run's orchestrator, and the TUI shows both.
        tmux_session.send("Down", "e")
        tmux_session.wait_for_text("Evict run_b?")
        tmux_session.type("enough of b")
        tmux_session.send("Enter")
        _wait(
            lambda: _process_state(experiment, "run_b").get("state") in ("stopped", "exited"),
            "the supervisor to stop run_b's orchestrator",
        )
        tmux_session.wait_for(
            lambda s: any("run_b" in line and "evicted" in line for line in s.splitlines()),
            "run_b shown as evicted",
        )
        eviction = run_control.read_eviction(experiment / "run_b")
        assert (eviction.reason, eviction.evicted_by) == ("enough of b", "tui")

        # Restart the trainer from the processes table, confirming the dialog.
        trainer_pid = _process_state(experiment, "trainer").get("pid")
        tmux_session.send("Tab", "Down", "Down", "r")  # supervisor, inference, trainer
        tmux_session.wait_for_text("Restart trainer?")
        tmux_session.send("y")
        _wait(
            lambda: (
                _process_state(experiment, "trainer").get("pid") not in (None, trainer_pid)
                and _process_state(experiment, "trainer").get("state") == "running"
            ),
            "a new trainer",
        )

        # Quit: the TUI goes, the experiment stays.
        tmux_session.send("q")
        tmux_session.wait_for_text("TUI-EXITED=0")
        assert SupervisorClient(experiment).is_running()
        assert _process_state(experiment, "run_a").get("state") == "running"
    finally:
        stop_experiment(experiment, timeout_s=30)
