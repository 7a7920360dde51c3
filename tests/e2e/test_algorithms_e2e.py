"""The shipped algorithms recipe end to end with every real part (vLLM's CPU build, the
torchrun trainer, one orchestrator per run, the supervisor, the built-in tiny model): six
runs of six loss kinds and four advantage settings share one trainer; each run records its
rewards, and every trainer line of a run names the loss that run asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cli import REPO, workbench
from workbench.config import load_orchestrator_config
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow

STEPS = 4
KINDS = {
    "run_default": "default",
    "run_ppo": "ppo",
    "run_gspo": "gspo",
    "run_cispo": "cispo",
    "run_is_rloo": "is",
    "run_reinforce_kl": "reinforce",
}


def test_six_algorithms_share_one_trainer_and_each_trains_with_its_own_loss(tmp_path: Path):
    experiment = tmp_path / "outputs" / "algorithms"
    try:
        result = workbench(
            "up", str(REPO / "recipes" / "algorithms.toml"), "--headless",
            "--max-steps", str(STEPS), cwd=tmp_path, timeout=15 * 60,
        )  # fmt: skip
    finally:
        if (experiment / "supervisor").exists():
            workbench("down", str(experiment), cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    for run_id, kind in KINDS.items():
        run = experiment / run_id
        assert run_control.is_finished(run), run_id
        assert load_orchestrator_config(layout.orch_config_path(run)).loss.kind == kind
        rewards = [m for m in read_metrics(run, "orchestrator") if m.get("written", True)]
        assert len(rewards) >= STEPS and all(0 <= m["reward_mean"] <= 1 for m in rewards)
        lines = read_metrics(run, "trainer")
        assert sorted(m["step"] for m in lines) == list(range(1, STEPS + 1)), run_id
        assert {m["loss_kind"] for m in lines} == {kind}, run_id
        for line in lines:
            assert 0 <= line["clipped"] <= 1, line
            assert line["ratio_min"] <= line["ratio_mean"] <= line["ratio_max"], line
            assert ("base_kl" in line) == (run_id == "run_reinforce_kl"), line
        assert layout.latest_stable_step(layout.broadcasts_dir(run)) == STEPS
    # One trainer served them all: its single log has every run's updates.
    trainer_log = layout.process_log_path(experiment, "trainer").read_text()
    for run_id in KINDS:
        assert f"{run_id} step {STEPS} loss" in trainer_log, run_id
