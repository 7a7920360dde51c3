"""`workbench compare`: the runs of several experiments ranked together, read from real
experiment directories.

Each experiment is made as `workbench up` makes it (`read_recipe` then `create_experiment`),
its metrics written by the orchestrator's writer (`append_metrics`), its forks by `runs
fork` (`fork_run`) from checkpoints laid out as the trainer leaves them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from tests.helpers import BUILTIN_BASE as BASE
from tests.helpers import keep_trainer_checkpoint, make_experiment, record_evals
from workbench.cli import app
from workbench.files import layout, run_control
from workbench.supervisor.fork import fork_run
from workbench.sweep.compare import compare_experiments, comparison_figure


@pytest.fixture
def last_week(tmp_path: Path) -> Path:
    experiment = make_experiment(
        tmp_path,
        "last_week",
        "lr = 3e-3\nbatch_size = 64",
        '[[runs]]\nid = "lr3e-3"\n\n[[runs]]\nid = "lr5e-3"\nlr = 5e-3\n',
    )
    record_evals(experiment, "run_lr3e-3", (0, 0.4), (10, 0.6), (20, 0.7))
    record_evals(experiment, "run_lr5e-3", (0, 0.4), (10, 0.65), (20, 0.75))
    return experiment


@pytest.fixture
def this_week(tmp_path: Path) -> Path:
    experiment = make_experiment(
        tmp_path, "this_week", "lr = 3e-3\nbatch_size = 128", '[[runs]]\nid = "lr3e-3"\n'
    )
    record_evals(experiment, "run_lr3e-3", (0, 0.4), (10, 0.7), (20, 0.8))
    return experiment


def compare(*args: object):
    runner = CliRunner(env={"COLUMNS": "200"})
    return runner.invoke(app, ["compare", *(str(arg) for arg in args)])


def test_runs_of_two_experiments_are_ranked_together_by_their_last_eval(
    last_week: Path, this_week: Path
):
    comparison = compare_experiments([last_week, this_week])
    (group,) = comparison.groups
    ranked = [(run.experiment_label, run.outcome.id, run.outcome.value) for run in group.runs]
    assert ranked == [
        ("this_week", "run_lr3e-3", 0.8),
        ("last_week", "run_lr5e-3", 0.75),
        ("last_week", "run_lr3e-3", 0.7),
    ]
    assert group.best is group.runs[0]
    assert comparison.apart_reason() is None


def test_a_run_shows_only_the_values_that_differ_between_the_runs_compared(
    last_week: Path, this_week: Path
):
    (group,) = compare_experiments([last_week, this_week]).groups
    differences = {(r.experiment_label, r.outcome.id): r.outcome.differences for r in group.runs}
    # max_steps, env and every other value are the same in all three: not shown.
    assert differences == {
        ("this_week", "run_lr3e-3"): {"batch_size": 128, "lr": 3e-3},
        ("last_week", "run_lr5e-3"): {"batch_size": 64, "lr": 5e-3},
        ("last_week", "run_lr3e-3"): {"batch_size": 64, "lr": 3e-3},
    }


def test_the_table_names_each_runs_experiment_value_step_and_the_best_run(
    last_week: Path, this_week: Path
):
    result = compare(last_week, this_week)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "2 experiments, 3 runs, by eval_reward_mean (highest first)" in lines[0]
    rows = [line for line in lines if "run_lr" in line and "best" not in line]
    cells = [[cell.strip() for cell in row.split("│")[1:6]] for row in rows]
    assert cells == [
        ["1", "this_week", "run_lr3e-3", "0.8 @ 20", "20"],
        ["2", "last_week", "run_lr5e-3", "0.75 @ 20", "20"],
        ["3", "last_week", "run_lr3e-3", "0.7 @ 20", "20"],
    ]
    assert "batch_size=128" in rows[0]
    assert "best: this_week/run_lr3e-3 (eval_reward_mean 0.8)" in result.output


def test_a_forked_run_shows_its_whole_lineage(last_week: Path, this_week: Path):
    keep_trainer_checkpoint(last_week, "run_lr5e-3", 20)
    fork_run(last_week, "run_lr5e-3@20", "longer", {"max_steps": 40})
    keep_trainer_checkpoint(last_week, "run_longer", 30)
    fork_run(last_week, "run_longer@30", "longest", {"max_steps": 50, "lr": 1e-3})
    record_evals(last_week, "run_longest", (40, 0.85))
    comparison = compare_experiments([last_week, this_week])
    runs = {(r.experiment_label, r.outcome.id): r for r in comparison.groups[0].runs}
    longest = runs[("last_week", "run_longest")]
    assert longest.outcome.rank == 1
    assert longest.describe_lineage() == "run_longer@30 <- run_lr5e-3@20"
    assert runs[("last_week", "run_lr5e-3")].lineage == []
    assert not any(key.startswith("forked_from") for key in longest.outcome.differences)

    result = compare(last_week, this_week, "--json")
    assert result.exit_code == 0, result.output
    first = json.loads(result.output)["groups"][0]["runs"][0]
    assert first["id"] == "run_longest"
    assert first["lineage"] == [
        {"run": "run_longer", "step": 30},
        {"run": "run_lr5e-3", "step": 20},
    ]
    text = compare(last_week, this_week)
    assert "run_longer@30 <- run_lr5e-3@20" in text.output


def test_experiments_on_another_base_model_are_ranked_apart_and_the_output_says_why(
    tmp_path: Path, last_week: Path
):
    chat = make_experiment(
        tmp_path, "chat", "lr = 3e-3", '[[runs]]\nid = "a"\n', base="builtin:tiny-reverse-chat"
    )
    record_evals(chat, "run_a", (0, 0.9))  # higher, but of another model
    comparison = compare_experiments([last_week, chat])
    groups = [(g.base_model, g.env, [r.outcome.id for r in g.runs]) for g in comparison.groups]
    assert groups == [
        (BASE, "reverse_text", ["run_lr5e-3", "run_lr3e-3"]),
        ("builtin:tiny-reverse-chat", "reverse_text", ["run_a"]),
    ]
    assert [run.outcome.rank for run in comparison.groups[1].runs] == [1]
    reason = comparison.apart_reason()
    assert reason is not None and "different base models" in reason

    result = compare(last_week, chat)
    assert result.exit_code == 0, result.output
    assert "ranked in 2 separate groups: the runs train on different base models" in (result.output)
    assert f"base model {BASE} · env reverse_text" in result.output
    assert "base model builtin:tiny-reverse-chat · env reverse_text" in result.output
    payload = json.loads(compare(last_week, chat, "--json").output)
    assert [group["best"]["id"] for group in payload["groups"]] == ["run_lr5e-3", "run_a"]
    assert "different base models" in payload["apart"]


def test_runs_on_another_environment_are_ranked_apart(tmp_path: Path, last_week: Path):
    chain = make_experiment(
        tmp_path, "chain", "lr = 3e-3", '[[runs]]\nid = "a"\n', env="reverse_chain"
    )
    record_evals(chain, "run_a", (0, 0.2))
    comparison = compare_experiments([last_week, chain])
    assert [(g.env, len(g.runs)) for g in comparison.groups] == [
        ("reverse_text", 2),
        ("reverse_chain", 1),
    ]
    assert "different environments" in (comparison.apart_reason() or "")


def test_without_arguments_every_experiment_under_outputs_is_compared(
    tmp_path: Path, last_week: Path, this_week: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "outputs" / "notes").mkdir()  # not an experiment: left out
    monkeypatch.chdir(tmp_path)
    payload = json.loads(compare("--json").output)
    assert payload["experiments"] == ["outputs/last_week", "outputs/this_week"]
    assert len(payload["groups"][0]["runs"]) == 3


def test_a_path_that_is_not_an_experiment_is_named_in_the_error(tmp_path: Path, last_week: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = tmp_path / "missing"
    result = compare(last_week, empty, missing)
    assert result.exit_code == 1
    assert f"{empty} is not an experiment directory" in result.output
    assert f"{missing} does not exist" in result.output


def test_nothing_under_outputs_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    result = compare()
    assert result.exit_code == 1
    assert "no experiment found under ./outputs" in result.output


def test_a_diverged_run_ranks_last_and_a_run_without_evals_after_those_with(
    last_week: Path, this_week: Path
):
    run_control.write_eviction(
        layout.run_dir(this_week, "run_lr3e-3"), "diverged: gradient norm nan", by="trainer"
    )
    (group,) = compare_experiments([last_week, this_week]).groups
    assert [(r.experiment_label, r.outcome.diverged) for r in group.runs][-1] == (
        "this_week",
        True,
    )
    assert group.best is not None and group.best.outcome.id == "run_lr5e-3"


def test_a_metric_of_choice_ranks_lowest_first_with_mode_min(last_week: Path, this_week: Path):
    comparison = compare_experiments([last_week, this_week], metric="reward_mean", mode="min")
    values = [run.outcome.value for run in comparison.groups[0].runs]
    assert values == sorted(values)
    assert values[0] == pytest.approx(0.65)


def test_a_mode_other_than_max_or_min_is_refused(last_week: Path):
    result = compare(last_week, "--mode", "up")
    assert result.exit_code == 2
    assert "choose max or min" in result.output


# ---------------------------------------------------------------- plot EXPERIMENT...


def lines_by_label(axes) -> dict[str, tuple[list, list]]:
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axes.lines
    }


def test_plot_draws_the_runs_of_several_experiments_on_one_chart_named_by_experiment(
    last_week: Path, this_week: Path
):
    figure, apart = comparison_figure([last_week, this_week])
    assert apart is None
    rewards, evals = figure.axes
    assert sorted(lines_by_label(evals)) == [
        "last_week/run_lr3e-3",
        "last_week/run_lr5e-3",
        "this_week/run_lr3e-3",
    ]
    assert lines_by_label(evals)["this_week/run_lr3e-3"] == ([0, 10, 20], [0.4, 0.7, 0.8])
    assert len(lines_by_label(rewards)) == 3
    (legend,) = figure.legends
    assert len(legend.get_texts()) == 3  # one entry per run, though drawn in both panels


def test_plot_draws_runs_of_another_base_model_in_a_row_of_their_own(
    tmp_path: Path, last_week: Path
):
    chat = make_experiment(
        tmp_path, "chat", "lr = 3e-3", '[[runs]]\nid = "a"\n', base="builtin:tiny-reverse-chat"
    )
    record_evals(chat, "run_a", (0, 0.9))
    figure, apart = comparison_figure([last_week, chat])
    visible = [axes for axes in figure.axes if axes.get_visible()]
    assert [axes.get_title() for axes in visible] == [
        f"{BASE} · reverse_text",
        f"{BASE} · reverse_text",
        "builtin:tiny-reverse-chat · reverse_text",
        "builtin:tiny-reverse-chat · reverse_text",
    ]
    assert sorted(lines_by_label(visible[3])) == ["chat/run_a"]
    assert "chat/run_a" not in lines_by_label(visible[1])
    assert apart is not None and "different base models" in apart

    output = tmp_path / "compared.png"
    result = CliRunner().invoke(app, ["plot", str(last_week), str(chat), "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert "drawn in 2 separate groups" in result.output
    assert imread(output).shape[0] > 500  # two rows of panels


def test_plot_names_a_path_that_is_not_an_experiment(tmp_path: Path, last_week: Path):
    output = tmp_path / "x.png"
    result = CliRunner().invoke(app, ["plot", str(last_week), str(tmp_path), "-o", str(output)])
    assert result.exit_code == 1
    assert f"{tmp_path} is not an experiment directory" in result.output
    assert not output.exists()


SWEEP_ON_REWARD = """\
[sweep.grid]
lr = [1e-3, 3e-3]

[sweep.scheduler]
kind = "asha"
metric = "reward_mean"
mode = "max"
grace_steps = 10
"""


def test_experiments_ranked_by_their_own_metric_are_compared_on_it(tmp_path: Path):
    sweep = make_experiment(tmp_path, "sweep", "lr = 3e-3", SWEEP_ON_REWARD)
    for run_id, value in (("run_lr1e-3", 0.5), ("run_lr3e-3", 0.6)):
        record_evals(sweep, run_id, (10, value))
    comparison = compare_experiments([sweep])
    assert (comparison.metric, comparison.notes) == ("reward_mean", [])
    assert [run.outcome.value for run in comparison.groups[0].runs] == pytest.approx([0.55, 0.45])


def test_experiments_ranked_by_different_metrics_are_compared_on_eval_reward_and_say_so(
    tmp_path: Path, last_week: Path
):
    sweep = make_experiment(tmp_path, "sweep", "lr = 3e-3", SWEEP_ON_REWARD)
    record_evals(sweep, "run_lr1e-3", (10, 0.9))
    result = compare(last_week, sweep)
    assert result.exit_code == 0, result.output
    assert "by eval_reward_mean" in result.output
    assert "note: the experiments rank by different metrics" in result.output
    assert "sweep: reward_mean (max)" in result.output
    assert "best: sweep/run_lr1e-3 (eval_reward_mean 0.9)" in result.output


def test_ranked_by_asymptote_the_table_adds_the_fit(last_week: Path, this_week: Path):
    result = compare(last_week, this_week, "--by", "asymptote")
    assert result.exit_code == 0, result.output
    assert "asymptote" in result.output
    assert "unreliable" in result.output  # three evals are too few for a reliable fit
    assert json.loads(compare(last_week, "--by", "asymptote", "--json").output)["ranked_by"] == (
        "asymptote"
    )
    refused = compare(last_week, "--by", "best")
    assert refused.exit_code == 2
    assert "choose last or asymptote" in refused.output
