"""`workbench plot`: every run's reward and eval curves on one chart (workbench/curves.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from tests.helpers import make_run
from workbench.cli import app
from workbench.curves import NothingToPlot, experiment_figure, metric_curve
from workbench.files.metrics import append_metrics


def write_run(experiment: Path, run_id: str, rewards: list[float], evals: dict[int, float]):
    run = make_run(experiment, run_id)
    for step, reward in enumerate(rewards, start=1):
        append_metrics(run, "orchestrator", step, reward_mean=reward)
        append_metrics(run, "trainer", step - 1, loss=1.0)
    for step, value in evals.items():
        append_metrics(run, "eval", step, eval_reward_mean=value)
    return run


@pytest.fixture
def three_runs(experiment: Path) -> Path:
    write_run(experiment, "run_a", [0.1, 0.3, 0.5], {0: 0.2, 2: 0.4})
    write_run(experiment, "run_b", [0.2, 0.2], {0: 0.2})
    write_run(experiment, "run_c", [0.4, 0.6, 0.7, 0.9], {})  # evals off
    return experiment


def lines_by_label(axes) -> dict[str, tuple[list, list, tuple]]:
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()), line.get_color())
        for line in axes.lines
    }


def test_every_run_has_one_reward_line_and_runs_with_evals_one_eval_line(three_runs: Path):
    figure = experiment_figure(three_runs)
    rewards, evals = figure.axes
    reward_lines = lines_by_label(rewards)
    assert sorted(reward_lines) == ["run_a", "run_b", "run_c"]
    assert reward_lines["run_a"][:2] == ([1, 2, 3], [0.1, 0.3, 0.5])
    eval_lines = lines_by_label(evals)
    assert sorted(eval_lines) == ["run_a", "run_b"]
    assert eval_lines["run_a"][:2] == ([0, 2], [0.2, 0.4])


def test_each_run_keeps_its_colour_in_both_panels_and_runs_differ(three_runs: Path):
    rewards, evals = experiment_figure(three_runs).axes
    reward_colours = {label: line[2] for label, line in lines_by_label(rewards).items()}
    eval_colours = {label: line[2] for label, line in lines_by_label(evals).items()}
    assert len(set(reward_colours.values())) == 3
    assert all(eval_colours[run] == reward_colours[run] for run in eval_colours)


def test_the_legend_names_every_run_once(three_runs: Path):
    (legend,) = experiment_figure(three_runs).legends
    assert [text.get_text() for text in legend.get_texts()] == ["run_a", "run_b", "run_c"]


def test_without_any_eval_there_is_one_panel(experiment: Path):
    write_run(experiment, "run_a", [0.1, 0.2], {})
    assert len(experiment_figure(experiment).axes) == 1


def test_a_step_recorded_twice_keeps_the_value_written_last():
    records = [{"step": 3, "reward_mean": 0.0}, {"step": 3, "reward_mean": 0.5}]
    records.append({"step": 4, "reward_mean": float("nan")})
    assert metric_curve(records, "reward_mean") == [(3, 0.5)]


def test_an_experiment_without_records_has_nothing_to_plot(experiment: Path):
    make_run(experiment, "run_a")
    with pytest.raises(NothingToPlot, match="no run of"):
        experiment_figure(experiment)


def test_the_command_writes_a_png_of_the_chart(three_runs: Path, tmp_path: Path):
    output = tmp_path / "runs.png"
    result = CliRunner().invoke(app, ["plot", str(three_runs), "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert f"written: {output}" in result.output
    image = imread(output)  # a PNG that decodes
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_the_command_refuses_a_file_name_without_an_image_format(three_runs: Path, tmp_path: Path):
    result = CliRunner().invoke(app, ["plot", str(three_runs), "-o", str(tmp_path / "runs.txt")])
    assert result.exit_code == 2
    assert "cannot tell the image format" in result.output
    assert not (tmp_path / "runs.txt").exists()


def test_the_command_says_when_there_is_nothing_to_plot(experiment: Path, tmp_path: Path):
    make_run(experiment, "run_a")
    result = CliRunner().invoke(app, ["plot", str(experiment), "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 1
    assert "no run of" in result.output
