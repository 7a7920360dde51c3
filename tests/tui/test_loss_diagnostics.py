"""A run's loss at its latest update in its details: kind, clipped share, ratio, KL to base."""

from __future__ import annotations

from pathlib import Path

from tests.tui.conftest import next_polls, press_for
from tests.tui.synthetic import append_metrics
from workbench.tui.data import MetricsReader
from workbench.tui.screens.run_detail import RunDetailScreen

PPO_LINE = {
    "source": "trainer",
    "step": 9,
    "loss": 0.1,
    "tokens": 100,
    "loss_kind": "ppo",
    "clipped": 0.031,
    "masked": 0.031,
    "ratio_mean": 1.002,
    "ratio_min": 0.61,
    "ratio_max": 1.85,
    "base_kl": 0.0012,
}


def test_the_latest_trainer_line_gives_the_runs_loss_diagnostics(tmp_path: Path):
    run = tmp_path / "run_a"
    run.mkdir()
    append_metrics(run, [PPO_LINE, {**PPO_LINE, "step": 10, "clipped": 0.05}])
    reader = MetricsReader(run / "metrics.jsonl")
    assert reader.poll()
    assert reader.loss.kind == "ppo" and reader.loss.clipped == 0.05
    assert reader.loss.ratio_max == 1.85 and reader.loss.base_kl == 0.0012


def test_a_trainer_line_from_before_loss_kinds_gives_none(tmp_path: Path):
    run = tmp_path / "run_a"
    run.mkdir()
    append_metrics(run, [{"source": "trainer", "step": 1, "loss": 0.1, "masked": 0.0}])
    reader = MetricsReader(run / "metrics.jsonl")
    assert reader.poll() and reader.loss is None


async def test_the_run_detail_shows_the_runs_loss_at_its_latest_update(experiment, make_app):
    append_metrics(experiment / "run_lr1e-3", [PPO_LINE])
    app = make_app(experiment)
    async with app.run_test(size=(120, 30)) as pilot:
        await next_polls(pilot, app)
        await press_for(pilot, "enter", RunDetailScreen)
        summary = str(app.screen.query_one("#detail-summary").content)
        assert "loss ppo  clipped 3.1%  ratio 1.002 [0.61, 1.85]  KL to base 0.0012" in summary
