"""Alerts end to end, with every real part (vLLM's CPU build, the torchrun trainer, the
orchestrators, the supervisor, the built-in tiny model): each condition is made to happen,
not written into a file, and the supervisor raises its alert once.

- run_x: lr 1e30, a NaN loss at its second update (as tests/trainer/rl/test_divergence.py
  measured): `non_finite`.
- run_hot: lr 3e-2, ten times the shipped recipe's: the model forgets the task. Measured on
  2026-12-07: held-out reward 0.61 at step 0 and 0.07 at step 2 (`eval_regression`), the
  training reward 0.56 -> 0.06 by step 3 (`reward_collapse`), and the trainer's policy so far
  from the one that sampled (async_level 1) that the mean importance ratio is 0.19 to 0.25
  (`ratio_spike`). Its numbers may then overflow in vLLM: evicted as diverged, not restarted.
- run_flaky: healthy, but the test stops its orchestrator (SIGSTOP) for longer than
  `stall_s` (`stall`), then kills it three times, each after the supervisor restarted it
  (`restarts`), and evicts it.
- run_good: healthy beside them: no alert with the default thresholds.

`kl_spike` is not made here: on this model KL to the base jumps from 0 to about 4 at the
first update a high lr makes, before the rule has the median of quiet updates it compares
with; tests/alerts/test_rules.py covers it on records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.cli import WORKBENCH, environment, workbench
from workbench.files import run_control
from workbench.files.metrics import read_metrics
from workbench.supervisor.client import read_state

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow

STALL_S = 10
RECIPE = f"""\
[experiment]
name = "alerts"
output_dir = "outputs/alerts"
[model]
base = "builtin:tiny-reverse"
[inference]
max_loras = 8
[trainer]
max_concurrent_runs = 4
[alerts]
stall_s = {STALL_S}
[defaults]
env_args = {{ min_length = 9, max_length = 9 }}
max_steps = 6
batch_size = 32
rollouts_per_prompt = 8
lr = 3e-3
async_level = 1
eval = {{ interval = 0 }}
[[runs]]
id = "good"
[[runs]]
id = "x"
lr = 1e30
[[runs]]
id = "hot"
lr = 3e-2
eval = {{ interval = 2 }}
[[runs]]
id = "flaky"
max_steps = 200
"""


def orchestrator_pid(experiment: Path, run_id: str) -> int | None:
    record = ((read_state(experiment) or {}).get("processes") or {}).get(run_id) or {}
    pid = record.get("pid")
    return pid if isinstance(pid, int) and record.get("state") == "running" else None


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"no {what} in {timeout:.0f} s")


def make_trouble(experiment: Path) -> None:
    """run_flaky: stalled past stall_s, then its orchestrator killed three times, then
    evicted (an evicted run records nothing on purpose: no stall after that)."""
    run = experiment / "run_flaky"
    wait_for(lambda: read_metrics(run, "orchestrator"), 300, "first step of run_flaky")
    pid = wait_for(lambda: orchestrator_pid(experiment, "run_flaky"), 60, "orchestrator")
    os.kill(pid, signal.SIGSTOP)
    try:
        # Past stall_s after its last record (the trainer may still log an update of a
        # batch sent before the stop), and a poll of the watcher's.
        time.sleep(STALL_S + 12)
    finally:
        os.kill(pid, signal.SIGCONT)
    for _ in range(3):
        pid = wait_for(lambda: orchestrator_pid(experiment, "run_flaky"), 120, "restart")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda p=pid: orchestrator_pid(experiment, "run_flaky") != p, 60, "exit")
    wait_for(lambda: orchestrator_pid(experiment, "run_flaky"), 120, "restart")
    result = workbench(
        "evict", run.name, "-e", str(experiment), "--reason", "made trouble on purpose",
        cwd=experiment,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_condition_made_to_happen_is_one_alert_that_workbench_alerts_reports(
    tmp_path: Path,
):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    experiment = tmp_path / "outputs" / "alerts"
    with open(tmp_path / "up.log", "w") as log:
        up = subprocess.Popen(
            [*WORKBENCH, "up", str(recipe), "--headless"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=environment(),
        )  # fmt: skip
    try:
        make_trouble(experiment)
        code = up.wait(timeout=10 * 60)
    finally:
        if up.poll() is None:
            up.kill()
        if (experiment / "supervisor").exists():
            workbench("down", str(experiment), cwd=tmp_path, timeout=180)
    output = (tmp_path / "up.log").read_text()[-3000:]
    # run_x ends evicted as diverged, or failed after its orchestrator's restarts: `up`
    # then exits 1; run_good finishes either way.
    assert code in (0, 1), output
    assert run_control.is_finished(experiment / "run_good"), output

    reported = workbench("alerts", str(experiment), "--json", cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    alerts = json.loads(reported.stdout)["alerts"]
    by_run: dict[str, list[str]] = {}
    for alert in alerts:
        by_run.setdefault(alert["run"] or alert.get("process") or "", []).append(alert["rule"])
    why = json.dumps(alerts, indent=1) + "\n" + output
    assert "run_good" not in by_run, why

    non_finite = [a for a in alerts if a["rule"] == "non_finite"]
    assert [a["run"] for a in non_finite] == ["run_x"], why
    assert non_finite[0]["step"] == 2 and non_finite[0]["values"]["loss"] == "nan", why
    assert non_finite[0]["message"].startswith("non-finite loss nan"), why

    hot = by_run.get("run_hot", [])
    for rule in ("eval_regression", "reward_collapse", "ratio_spike"):
        assert hot.count(rule) == 1, f"{rule}: {why}"

    assert sorted(by_run.get("run_flaky", [])) == ["restarts", "stall"], why
    # A policy that overflows (run_hot, run_x) is evicted as diverged by its orchestrator,
    # not restarted into a burst of failures (tests/orchestrator/test_non_finite_samples.py).
    assert [a["process"] for a in alerts if a["rule"] == "restarts"] == ["run_flaky"], why
    assert [a["run"] for a in alerts if a["rule"] == "stall"] == ["run_flaky"], why

    table = workbench("alerts", str(experiment), "--since", "1h", cwd=tmp_path)
    for shown in ("run_x", "non_finite", "run_hot", "ratio_spike", "stall", "restarts"):
        assert shown in table.stdout, table.stdout
