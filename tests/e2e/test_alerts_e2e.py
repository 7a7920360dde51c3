"""Alerts end to end, with every real part (vLLM's CPU build, the torchrun trainer, the
orchestrators, the supervisor, the built-in tiny model): a run whose learning rate is far
too high gets a NaN loss at its second update (as tests/trainer/rl/test_divergence.py
measured for lr 1e30), the supervisor raises one non_finite alert for it, and
`workbench alerts --json` reports it once the experiment is over; the healthy run beside it
raises none with the default thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import workbench
from workbench.files import layout, run_control
from workbench.system.file_tail import last_lines

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow


RECIPE = """\
[experiment]
name = "alerts"
output_dir = "outputs/alerts"
[model]
base = "builtin:tiny-reverse"
[inference]
max_loras = 4
[trainer]
max_concurrent_runs = 2
[defaults]
env_args = { min_length = 5, max_length = 5 }
max_steps = 6
batch_size = 32
rollouts_per_prompt = 8
lr = 3e-3
eval = { interval = 0 }
[[runs]]
id = "good"
[[runs]]
id = "x"
lr = 1e30
"""


def test_a_diverging_run_is_one_non_finite_alert_that_workbench_alerts_reports(tmp_path: Path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    experiment = tmp_path / "outputs" / "alerts"
    try:
        result = workbench("up", str(recipe), "--headless", cwd=tmp_path, timeout=12 * 60)
    finally:
        if (experiment / "supervisor").exists():
            workbench("down", str(experiment), cwd=tmp_path, timeout=180)
    # run_x ends evicted as diverged, or (seen once) failed after its orchestrator's
    # restarts: `up` then exits 1; run_good finishes either way.
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
    assert run_control.is_finished(experiment / "run_good"), result.stdout[-3000:]

    reported = workbench("alerts", str(experiment), "--json", cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    alerts = json.loads(reported.stdout)["alerts"]
    log = last_lines(layout.orchestrator_log_path(experiment / "run_x"), 30)
    why = f"{alerts}\n{result.stdout[-2000:]}\nrun_x's orchestrator:\n" + "\n".join(log)
    assert all(a["run"] == "run_x" for a in alerts), why  # none for the healthy run
    non_finite = [a for a in alerts if a["rule"] == "non_finite"]
    assert len(non_finite) == 1, why
    [alert] = non_finite
    assert alert["step"] == 2 and alert["values"]["loss"] == "nan", why
    assert alert["message"].startswith("non-finite loss nan"), why
    # Its orchestrator failing again and again, if it did, is the restarts alert, once.
    assert {a["rule"] for a in alerts} <= {"non_finite", "restarts"}, why
    assert len(alerts) == len({a["rule"] for a in alerts}), why
    table = workbench("alerts", str(experiment), "--since", "1h", cwd=tmp_path)
    assert "run_x" in table.stdout and "non_finite" in table.stdout
