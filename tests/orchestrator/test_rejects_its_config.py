"""An orchestrator whose run cannot work rejects the run at once, before waiting for the
trainer's adapters or for inference: `control/config_validation_error.txt` says why and
names the `orch.toml` it read, so the trainer frees the run's slot and looks again only
once the file changes (tests/trainer/runs/test_manager.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import make_run
from workbench.files import run_control


def test_an_unknown_environment_rejects_the_run_before_anything_is_waited_for(tmp_path: Path):
    # No supervisor/endpoint.json: an orchestrator that checked its config only later
    # would wait for inference forever.
    run = make_run(tmp_path / "exp", "run_a", 'env = "nope"\n')
    result = subprocess.run(
        [sys.executable, "-m", "workbench.orchestrator", "--run-dir", str(run)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    reason = run_control.read_validation_error(run)
    assert reason is not None and "orch.toml: env: unknown environment 'nope'" in reason
    assert not run_control.run_condition(run).reconsidered
    (run / "control" / "orch.toml").write_text('env = "letter_count"\n')
    assert run_control.run_condition(run).reconsidered, "an edited config deserves a new look"
