"""`loss` and `advantage` per run: a recipe, a sweep and orch.toml may set them; bad input is
refused before launch with the key, the valid choices and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.config import (
    ConfigError,
    DefaultLoss,
    GspoLoss,
    OrchestratorConfig,
    PpoLoss,
    deep_merge,
    load_orchestrator_config,
)
from workbench.experiment import orch_toml_text
from workbench.files import layout
from workbench.recipe import load_recipe

RECIPE = """\
[experiment]
name = "algorithms"

[model]
base = "builtin:tiny-reverse"

[trainer]
max_concurrent_runs = 3

[defaults]
max_steps = 2
{defaults}

[[runs]]
id = "ppo"
loss = {{ kind = "ppo", eps_high = 0.28, dual_clip = 3.0 }}

[[runs]]
id = "grpo"
loss = {{ kind = "gspo" }}
advantage = {{ scale = "group_std" }}
{extra}
"""


def recipe_at(tmp_path: Path, defaults: str = "", extra: str = "") -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE.format(defaults=defaults, extra=extra))
    return path


def message_of(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    return str(info.value)


def test_runs_choose_their_own_loss_and_advantage(tmp_path: Path):
    configs = load_recipe(recipe_at(tmp_path)).run_configs()
    assert configs["run_ppo"].loss == PpoLoss(eps_high=0.28, dual_clip=3.0)
    assert configs["run_ppo"].loss.eps_low == 0.2  # verl's default
    assert configs["run_grpo"].loss.aggregation == "sequence_mean"  # verl forces it
    assert (configs["run_grpo"].loss.eps_low, configs["run_grpo"].loss.eps_high) == (3e-4, 4e-4)
    assert configs["run_grpo"].advantage.scale == "group_std"
    assert configs["run_ppo"].advantage.baseline == "group_mean"


def test_defaults_loss_reaches_runs_that_do_not_choose_another_kind(tmp_path: Path):
    extra = '[[runs]]\nid = "plain"\n'
    configs = load_recipe(recipe_at(tmp_path, 'loss = { kind = "cispo" }', extra)).run_configs()
    assert configs["run_plain"].loss.kind == "cispo"
    assert configs["run_plain"].loss.weight_high == 4.0  # Tinker's
    assert configs["run_ppo"].loss.kind == "ppo"


def test_an_orch_toml_without_loss_keys_is_todays_loss(tmp_path: Path):
    path = tmp_path / "orch.toml"
    path.write_text("")
    config = load_orchestrator_config(path)
    assert config.loss == DefaultLoss() and config.loss.kind == "default"
    assert config.loss.aggregation == "token_mean"
    assert (config.advantage.baseline, config.advantage.scale) == ("group_mean", "none")


def test_an_unknown_kind_is_refused_with_the_known_ones(tmp_path: Path):
    message = message_of(recipe_at(tmp_path, extra='[[runs]]\nid = "x"\nloss = { kind = "grpo" }'))
    assert "runs[2].loss" in message
    assert "unknown loss.kind 'grpo'" in message
    for kind in ("default", "ppo", "gspo", "cispo", "is", "reinforce", "package.module:function"):
        assert kind in message


def test_a_knob_of_another_kind_is_refused_naming_its_kind_and_the_valid_ones(tmp_path: Path):
    extra = '[[runs]]\nid = "x"\nloss = { kind = "cispo", eps_high = 0.3 }'
    message = message_of(recipe_at(tmp_path, extra=extra))
    assert "loss.eps_high belongs to loss.kind ppo / gspo, not 'cispo'" in message
    assert "loss.weight_low, loss.weight_high" in message


def test_todays_knobs_belong_to_the_default_kind(tmp_path: Path):
    extra = '[[runs]]\nid = "x"\nloss = { kind = "ppo", kl_coef = 0.01 }'
    assert "loss.kl_coef belongs to loss.kind default" in message_of(
        recipe_at(tmp_path, extra=extra)
    )


@pytest.mark.parametrize(
    ("loss", "expected"),
    [
        ('{ kind = "ppo", eps_low = 1.0 }', "less than 1"),
        ('{ kind = "ppo", dual_clip = 1.0 }', "greater than 1"),
        ('{ kind = "cispo", weight_low = 5.0 }', "loss.weight_low (5) must be below"),
        ('{ aggregation = "per_token" }', "'token_mean', 'sequence_mean' or 'constant'"),
        ("{ normaliser = 100.0 }", "loss.normaliser is for aggregation = 'constant'"),
        ('{ base_kl_estimator = "k4" }', "'k1', 'k2' or 'k3'"),
        ("{ args = { scale = 2 } }", "loss.args belongs to loss.kind package.module:function"),
    ],
)
def test_bounds_and_choices_are_checked_before_launch(tmp_path: Path, loss: str, expected: str):
    message = message_of(recipe_at(tmp_path, extra=f'[[runs]]\nid = "x"\nloss = {loss}'))
    assert "runs[2].loss" in message and expected in message


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("no_such_package.losses:mine", "cannot import module 'no_such_package.losses'"),
        ("tests.trainer.custom_loss:missing", "has no function 'missing'"),
        ("tests.trainer.custom_loss:two_arguments", "must take one argument"),
    ],
)
def test_a_users_loss_that_does_not_load_is_refused(tmp_path: Path, kind: str, expected: str):
    message = message_of(
        recipe_at(tmp_path, extra=f'[[runs]]\nid = "x"\nloss = {{ kind = "{kind}" }}')
    )
    assert "runs[2].loss" in message and expected in message


def test_a_users_loss_that_loads_is_accepted_with_its_args():
    config = OrchestratorConfig.model_validate(
        {"loss": {"kind": "tests.trainer.custom_loss:scaled_reinforce", "args": {"scale": 2}}}
    )
    assert config.loss.args == {"scale": 2}


def test_a_sweep_can_vary_the_loss_kind(tmp_path: Path):
    sweep = '[sweep]\n[sweep.grid]\n"loss.kind" = ["ppo", "cispo", "reinforce"]\n'
    recipe = load_recipe(recipe_at(tmp_path, extra=sweep))
    kinds = sorted(config.loss.kind for config in recipe.run_configs().values())
    assert kinds == ["cispo", "gspo", "ppo", "ppo", "reinforce"]


def test_an_unknown_advantage_scale_lists_the_choices(tmp_path: Path):
    extra = '[[runs]]\nid = "x"\nadvantage = { scale = "std" }'
    message = message_of(recipe_at(tmp_path, extra=extra))
    assert "runs[2].advantage.scale" in message and "'group_std'" in message


def test_runs_add_set_chooses_the_new_runs_algorithm_and_refuses_a_foreign_knob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    experiment = tmp_path / "outputs" / "algorithms"
    experiment.mkdir(parents=True)
    (experiment / "recipe.toml").write_text(RECIPE.format(defaults="", extra=""))
    settings = ["--set", "loss.kind=ppo", "--set", "loss.eps_high=0.28"]
    settings += ["--set", "advantage.baseline=leave_one_out"]
    result = CliRunner().invoke(app, ["runs", "add", "c", *settings, "-e", str(experiment)])
    assert result.exit_code == 0, result.output
    config = load_orchestrator_config(layout.orch_config_path(experiment / "run_c"))
    assert (config.loss.kind, config.loss.eps_high) == ("ppo", 0.28)
    assert config.advantage.baseline == "leave_one_out"
    bad = CliRunner().invoke(
        app,
        [
            "runs",
            "add",
            "d",
            "--set",
            "loss.kind=is",
            "--set",
            "loss.eps_low=0.1",
            "-e",
            str(experiment),
        ],
    )
    assert bad.exit_code == 2 and "loss.eps_low belongs to loss.kind ppo / gspo" in bad.output


def test_a_knob_of_another_kind_is_refused_even_at_its_old_default(tmp_path: Path):
    # One flat table let a foreign knob through at its field's default (0.001 here): a
    # recipe's typo that did nothing. Each kind's class forbids keys it does not have.
    extra = '[[runs]]\nid = "x"\nloss = { kind = "ppo", kl_coef = 0.001 }'
    message = message_of(recipe_at(tmp_path, extra=extra))
    assert "runs[2].loss.kl_coef" in message
    assert (
        "loss.kl_coef belongs to loss.kind default, not 'ppo', which takes loss.eps_low" in message
    )


def test_each_kind_has_its_own_defaults_and_a_run_of_another_kind_takes_them(tmp_path: Path):
    # [defaults] of one kind under runs of others: each run takes its own kind's defaults
    # (gspo's sequence_mean and 3e-4 do not reach ppo), and a knob set in [defaults] reaches
    # the runs whose kind takes it.
    defaults = 'loss = { kind = "gspo", eps_high = 0.3 }'
    configs = load_recipe(recipe_at(tmp_path, defaults, '[[runs]]\nid = "same"\n')).run_configs()
    assert configs["run_ppo"].loss == PpoLoss(eps_high=0.28, dual_clip=3.0)
    assert configs["run_ppo"].loss.aggregation == "token_mean"
    assert configs["run_same"].loss == GspoLoss(eps_high=0.3)
    assert (configs["run_same"].loss.eps_low, configs["run_same"].loss.aggregation) == (
        3e-4,
        "sequence_mean",
    )
    assert configs["run_grpo"].loss == GspoLoss(eps_high=0.3)
    # A run whose kind does not take a knob [defaults] sets is told so, at its own table.
    extra = '[[runs]]\nid = "plain"\nloss = { kind = "is" }\n'
    message = message_of(recipe_at(tmp_path, defaults, extra))
    assert (
        "runs[2].loss.eps_high: loss.eps_high belongs to loss.kind ppo / gspo, not 'is'" in message
    )


@pytest.mark.parametrize(
    "loss",
    [
        {},
        {"kind": "ppo", "eps_high": 0.28, "dual_clip": 3.0},
        {"kind": "gspo", "aggregation": "token_mean"},
        {"kind": "cispo", "weight_high": 5.0},
        {"kind": "is", "aggregation": "constant", "normaliser": 512.0},
        {"kind": "reinforce", "base_kl_coef": 0.01},
        {"kind": "tests.trainer.custom_loss:scaled_reinforce", "args": {"scale": 2}},
    ],
)
def test_a_runs_orch_toml_reads_back_as_written_and_a_fork_may_change_its_kind(
    tmp_path: Path, loss: dict
):
    config = OrchestratorConfig.model_validate({"loss": loss})
    path = tmp_path / "orch.toml"
    path.write_text(orch_toml_text("run_x", config))
    again = load_orchestrator_config(path)
    assert again == config
    assert again.loss.model_fields_set - {"kind"} == config.loss.model_fields_set - {"kind"}
    # `workbench runs fork --set loss.kind=ppo`: the source's settings under the new kind,
    # which takes its own defaults, not the source kind's.
    forked = deep_merge(again.model_dump(mode="json"), {"loss": {"kind": "ppo"}})
    if set(loss) <= {"kind", "aggregation", "normaliser", "base_kl_coef"}:
        assert OrchestratorConfig.model_validate(forked).loss.eps_low == 0.2


def test_an_orch_toml_written_with_one_flat_loss_table_still_loads(tmp_path: Path):
    # What workbench wrote before each kind had a class: default's knobs at their defaults
    # and an empty args under every kind.
    path = tmp_path / "orch.toml"
    path.write_text(
        '[loss]\nkind = "ppo"\nmask_ratio_low = 0.125\nmask_ratio_high = 8.0\n'
        "mask_both_sides = false\nkl_coef = 0.001\neps_high = 0.28\nbase_kl_coef = 0.0\n"
        'base_kl_estimator = "k3"\n\n[loss.args]\n'
    )
    config = load_orchestrator_config(path)
    assert config.loss == PpoLoss(eps_high=0.28)
    assert "mask_ratio_low" not in config.model_dump(mode="json")["loss"]


def test_a_sweep_varies_a_knob_of_the_defaults_kind(tmp_path: Path):
    sweep = '[sweep]\n[sweep.grid]\n"loss.eps_high" = [0.2, 0.28]\n'
    recipe = load_recipe(recipe_at(tmp_path, 'loss = { kind = "ppo" }', sweep))
    swept = [c.loss for run_id, c in recipe.run_configs().items() if "eps_high" in run_id]
    assert sorted(loss.eps_high for loss in swept) == [0.2, 0.28]
    assert all(isinstance(loss, PpoLoss) for loss in swept)
    bad = '[sweep]\n[sweep.grid]\n"loss.eps_high" = [0.2, 0.28]\n'
    message = message_of(recipe_at(tmp_path, 'loss = { kind = "cispo" }', bad))
    assert "sweep.grid.loss.eps_high" in message
    assert "loss.eps_high belongs to loss.kind ppo / gspo, not 'cispo'" in message
