"""The sigmoid fit of eval reward against steps, and ranking a sweep by its asymptote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import make_run
from workbench.cli import app
from workbench.files import layout
from workbench.sweep.fit import SigmoidFit, fit_sigmoid
from workbench.sweep.report import build_report

STEPS = range(0, 45, 5)


def sigmoid(start: float, asymptote: float, midpoint: float, slope: float, step: int) -> float:
    if step == 0:
        return start
    return start + (asymptote - start) / (1 + (midpoint / step) ** slope)


def test_the_fit_recovers_the_curve_it_was_given():
    curve = [(s, sigmoid(0.6, 0.9, 8.0, 2.0, s)) for s in STEPS]
    fit = fit_sigmoid(curve)
    assert fit is not None and fit.reliable and fit.note is None
    assert fit.start == 0.6 and fit.points == 8
    assert fit.asymptote == pytest.approx(0.9, abs=0.005)
    assert fit.midpoint == pytest.approx(8.0, rel=0.05)
    assert fit.slope == pytest.approx(2.0, rel=0.1)
    assert fit.rmse < 1e-3
    assert fit.predict(400) == pytest.approx(0.9, abs=0.005)


def test_a_falling_curve_has_an_asymptote_below_its_start():
    curve = [(s, sigmoid(0.6, 0.05, 12.0, 3.0, s)) for s in STEPS]
    fit = fit_sigmoid(curve)
    assert fit is not None and fit.asymptote == pytest.approx(0.05, abs=0.01)


def test_a_curve_not_past_its_midpoint_is_an_unreliable_extrapolation():
    # Still climbing steadily at the last eval: the bend, hence the asymptote, is unseen.
    curve = [(s, sigmoid(0.6, 0.95, 60.0, 1.5, s)) for s in range(0, 25, 5)]
    fit = fit_sigmoid(curve)
    assert fit is not None and not fit.reliable
    assert fit.note is not None and fit.note.startswith("not past its midpoint yet (step 20 <")


def test_too_few_evals_are_unreliable_and_no_version_zero_is_no_fit():
    fit = fit_sigmoid([(0, 0.6), (5, 0.7), (10, 0.75)])
    assert fit is not None and not fit.reliable
    assert fit.note == "2 evals after version 0; a fit needs 4"
    assert fit_sigmoid([(5, 0.7), (10, 0.75)]) is None
    assert fit_sigmoid([(0, 0.6)]) is None


def write_evals(run: Path, points: list[tuple[int, float]]) -> None:
    lines = [{"source": "eval", "step": s, "eval_reward_mean": v, "time": 1.0} for s, v in points]
    layout.metrics_path(run).write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """run_steady levels off at 0.8 (a reliable fit); run_short has one higher eval only."""
    experiment = tmp_path / "exp"
    experiment.mkdir()
    steady = make_run(experiment, "run_steady", "max_steps = 40\n")
    write_evals(steady, [(s, sigmoid(0.6, 0.8, 6.0, 2.0, s)) for s in STEPS])
    write_evals(make_run(experiment, "run_short", "max_steps = 40\n"), [(0, 0.6), (5, 0.82)])
    return experiment


def test_ranked_by_asymptote_reliable_fits_come_first(sweep: Path):
    assert [run.id for run in build_report(sweep).runs] == ["run_short", "run_steady"]
    report = build_report(sweep, by="asymptote")
    assert [run.id for run in report.runs] == ["run_steady", "run_short"]
    steady, short = report.runs
    assert isinstance(steady.fit, SigmoidFit) and steady.fit.reliable
    assert report.score(steady) == steady.fit.asymptote
    assert report.score(short) == 0.82  # no reliable fit: its last eval
    assert report.to_json()["ranked_by"] == "asymptote"
    assert report.to_json()["runs"][0]["fit"]["reliable"] is True


def test_sweep_report_by_asymptote_on_the_command_line(sweep: Path):
    runner = CliRunner()
    shown = runner.invoke(app, ["sweep", "report", str(sweep), "--by", "asymptote", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["best"]["id"] == "run_steady"
    wrong = runner.invoke(app, ["sweep", "report", str(sweep), "--by", "median"])
    assert wrong.exit_code == 2
    assert "rank by 'median': choose last or asymptote" in wrong.output
