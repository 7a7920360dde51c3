"""The orchestrator's log reads as one line per step plus evals: a real orchestrator process
(its own logging setup and HTTP client) against the scripted server, its log read back."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import make_run
from tests.orchestrator.scripted import ScriptedChat, publish_adapter, scripted_server
from workbench.files import layout
from workbench.files.metrics import read_metrics

STEPS = 3
STEP_LINE = re.compile(
    r"INFO \S+: run_a step (?P<step>\d+) reward (?P<reward>[\d.]+) \+- (?P<std>[\d.]+) "
    r"len (?P<len>[\d.]+) truncated (?P<truncated>\d+)% policy (?P<policy>\d+) "
    r"gen [\d.]+s wait [\d.]+s"
)
EVAL_LINE = re.compile(r"INFO \S+: run_a eval of policy version (?P<version>\d+) ")


def run_orchestrator_to_the_end(run: Path) -> str:
    """Start the orchestrator as the supervisor does (stderr to its log), play the trainer's
    part once it has generated every step, and return its log."""
    log_path = layout.orchestrator_log_path(run)
    log_path.parent.mkdir(parents=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "workbench.orchestrator", "--run-dir", str(run)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120  # a bound on a hang, not a speed requirement
        while len(read_metrics(run, "orchestrator")) < STEPS and process.poll() is None:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        publish_adapter(run, STEPS)
        assert process.wait(timeout=120) == 0, log_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return log_path.read_text()


def test_the_log_has_one_line_per_step_with_its_figures_the_evals_and_no_http_requests(
    experiment: Path,
):
    # async_level = STEPS: every step may use the base model, so no trainer is needed
    # until the end; evals of the base model and of the last version.
    run = make_run(
        experiment,
        "run_a",
        f"max_steps = {STEPS}\nasync_level = {STEPS}\nbatch_size = 8\nrollouts_per_prompt = 4\n"
        "eval = { interval = 10, num_prompts = 4 }\n",
    )
    chat = ScriptedChat()
    with scripted_server(experiment, chat):
        log = run_orchestrator_to_the_end(run)

    assert len(chat.requests) > 2 * STEPS, "the HTTP client sent requests"
    assert "HTTP Request" not in log and "/v1/" not in log, log
    step_lines = [m for m in map(STEP_LINE.search, log.splitlines()) if m]
    records = read_metrics(run, "orchestrator")
    assert [int(m["step"]) for m in step_lines] == [r["step"] for r in records] == [0, 1, 2]
    for line, record in zip(step_lines, records, strict=True):
        assert line["reward"] == f"{record['reward_mean']:.3f}"
        assert line["std"] == f"{record['reward_std']:.3f}"
        assert line["len"] == f"{record['completion_len_mean']:.1f}"
        assert int(line["policy"]) == record["policy_version"] == 0
    evals = [int(m["version"]) for m in map(EVAL_LINE.search, log.splitlines()) if m]
    assert evals == [0, STEPS]
    # Besides steps and evals only the start and the end: the supervisor's marker lines are
    # not there when the test starts the process.
    others = [
        line for line in log.splitlines() if not (STEP_LINE.search(line) or EVAL_LINE.search(line))
    ]
    assert len(others) <= 3 and "finished 3 steps" in others[-1], log
