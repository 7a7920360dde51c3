"""Recipes and orch.toml: round trips keep comments; bad input names file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomlkit

from workbench import layout
from workbench.config import (
    ConfigError,
    OrchestratorConfig,
    load_orchestrator_config,
    parse_assignment,
    read_toml,
)
from workbench.experiment import create_experiment
from workbench.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]

GOOD_RECIPE = """\
# my sweep
[experiment]
name = "sweep"

[model]
base = "builtin:tiny-reverse"  # the tiny model

[trainer]
max_concurrent_runs = 2

[defaults]
max_steps = 5
lr = 3e-4

[[runs]]
id = "a"

[[runs]]
id = "run_b"
lr = 1e-3
sampling = { temperature = 0.7 }
"""


def write(tmp_path: Path, text: str, name: str = "recipe.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problem_of(path: Path, loader=load_recipe):
    with pytest.raises(ConfigError) as info:
        loader(path)
    return info.value


def test_shipped_recipe_is_valid_and_has_at_least_two_runs():
    recipe = load_recipe(REPO / "recipes" / "reverse_text.toml")
    assert recipe.model.base == "builtin:tiny-reverse"
    assert len(recipe.run_configs()) >= 2


def test_shipped_sweep_recipe_expands_to_a_learning_rate_by_rank_grid_with_early_stopping():
    recipe = load_recipe(REPO / "recipes" / "reverse_text_sweep.toml")
    runs = recipe.planned_runs
    assert len(runs) >= 8
    assert {run.values["lora.rank"] for run in runs} == {4, 8}
    rates = sorted({run.values["lr"] for run in runs})
    assert rates[0] <= 3e-4 and rates[-1] >= 3e-2
    assert recipe.trainer.max_concurrent_runs == 4
    spec = recipe.sweep.scheduler
    assert spec is not None and spec.metric == "eval_reward_mean"
    # Losers stop early: the first rung comes well before the end, and eval records land on it.
    max_steps = recipe.defaults.max_steps
    assert spec.rung_steps(max_steps) and spec.grace_steps <= max_steps // 4
    assert spec.grace_steps % recipe.defaults.eval.interval == 0


def test_shipped_gpu_recipe_is_valid_and_shares_one_gpu_between_vllm_and_the_trainer():
    import torch

    from workbench.supervisor.plan import assign_devices
    from workbench.trainer.attention_choice import AttentionRuntime, resolve_attention

    recipe = load_recipe(REPO / "recipes" / "reverse_text_qwen3.toml")
    assert recipe.model.base == "Qwen/Qwen3-0.6B"
    assert recipe.trainer.dtype == "bfloat16" and recipe.trainer.lora.rank == 16
    configs = recipe.run_configs()
    assert len(configs) == recipe.trainer.max_concurrent_runs == 4
    devices = assign_devices(recipe.inference.gpus, recipe.trainer.gpus, 1, gpu_count=1)
    assert devices.inference == devices.trainer == [0]
    assert recipe.inference.gpu_memory_utilization <= 0.5, "the trainer needs the rest"
    # Every adapter version in flight fits vLLM's LoRA slots: current and next per run.
    assert recipe.inference.max_loras >= 2 * len(configs)
    runtime = AttentionRuntime.detect("cuda", getattr(torch, recipe.trainer.dtype))
    assert resolve_attention(recipe.trainer.attention, runtime) != "dense"


def test_runs_get_defaults_merged_with_their_overrides(tmp_path: Path):
    recipe = load_recipe(write(tmp_path, GOOD_RECIPE))
    configs = recipe.run_configs()
    assert list(configs) == ["run_a", "run_b"], "ids get the run_ prefix unless they have it"
    assert configs["run_a"].lr == 3e-4 and configs["run_b"].lr == 1e-3
    assert configs["run_b"].sampling.temperature == 0.7
    assert configs["run_b"].sampling.max_tokens == OrchestratorConfig().sampling.max_tokens
    assert configs["run_a"].max_steps == configs["run_b"].max_steps == 5
    assert recipe.output_dir == Path("outputs/sweep")


def test_recipe_round_trip_through_tomlkit_keeps_comments(tmp_path: Path):
    document, _ = read_toml(write(tmp_path, GOOD_RECIPE))
    document["defaults"]["max_steps"] = 9
    out = tmp_path / "copy.toml"
    layout.atomic_write_text(out, tomlkit.dumps(document))  # as create_experiment writes it
    text = out.read_text()
    assert "# my sweep" in text and "# the tiny model" in text
    assert load_recipe(out).defaults.max_steps == 9
    assert text.replace("max_steps = 9", "max_steps = 5") == GOOD_RECIPE


def test_created_experiment_keeps_recipe_comments_and_writes_each_orch_toml(
    tmp_path: Path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    document, _ = read_toml(write(tmp_path, GOOD_RECIPE))
    recipe = load_recipe(tmp_path / "recipe.toml")
    experiment = create_experiment(recipe, document)
    assert (experiment / "recipe.toml").read_text() == GOOD_RECIPE
    run_b = load_orchestrator_config(experiment / "run_b" / "control" / "orch.toml")
    assert run_b.lr == 1e-3 and run_b.sampling.temperature == 0.7


def test_empty_orch_toml_is_a_valid_run_with_all_defaults(tmp_path: Path):
    config = load_orchestrator_config(write(tmp_path, "", "orch.toml"))
    assert config == OrchestratorConfig()


def test_unknown_key_names_file_line_key_and_suggests_the_right_one(tmp_path: Path):
    path = write(tmp_path, GOOD_RECIPE.replace("max_steps = 5", "max_step = 5"))
    error = problem_of(path)
    message = str(error)
    assert str(path) in message and "line 12" in message
    assert "defaults.max_step" in message and "did you mean 'max_steps'" in message


def test_unknown_key_in_a_run_points_at_that_run(tmp_path: Path):
    path = write(tmp_path, GOOD_RECIPE + "temprature = 0.5\n")
    message = str(problem_of(path))
    assert "runs[1].temprature" in message and "line 22" in message


def test_wrong_type_names_the_key_and_the_value(tmp_path: Path):
    path = write(tmp_path, GOOD_RECIPE.replace("lr = 1e-3", 'lr = "fast"'))
    message = str(problem_of(path))
    assert "runs[1].lr" in message and "'fast'" in message and "line 20" in message


def test_bad_run_id_is_rejected_with_the_offending_characters(tmp_path: Path):
    path = write(tmp_path, GOOD_RECIPE.replace('id = "a"', 'id = "a b/c"'))
    message = str(problem_of(path))
    assert "runs[0].id" in message and "' '" in message and "'/'" in message
    assert "line 16" in message


def test_duplicate_run_id_is_rejected_even_with_and_without_prefix(tmp_path: Path):
    path = write(tmp_path, GOOD_RECIPE.replace('id = "run_b"', 'id = "run_a"'))
    message = str(problem_of(path))
    assert "duplicate run id 'run_a'" in message and "runs[1].id" in message


def test_missing_base_model_says_what_to_add(tmp_path: Path):
    text = GOOD_RECIPE.replace('base = "builtin:tiny-reverse"  # the tiny model\n', "")
    message = str(problem_of(write(tmp_path, text)))
    assert "missing base model" in message and "[model]" in message


def test_invalid_toml_reports_the_line(tmp_path: Path):
    path = write(tmp_path, GOOD_RECIPE.replace("lr = 3e-4", "lr = = 3"))
    error = problem_of(path)
    assert error.problems[0].line == 13 and "not valid TOML" in str(error)


def test_every_problem_is_reported_at_once(tmp_path: Path):
    text = GOOD_RECIPE.replace("max_steps = 5", "max_steps = 0").replace('id = "a"', 'id = "!"')
    error = problem_of(write(tmp_path, text))
    keys = {p.key for p in error.problems}
    assert {"defaults.max_steps", "runs[0].id"} <= keys


def test_rule_across_keys_is_blamed_on_the_run_that_broke_it(tmp_path: Path):
    text = GOOD_RECIPE.replace("lr = 1e-3", "lr = 1e-3\nrollouts_per_prompt = 7")
    message = str(problem_of(write(tmp_path, text)))
    assert "runs[1]" in message and "multiple of rollouts_per_prompt" in message


def test_more_runs_than_slots_is_not_an_error(tmp_path: Path):
    text = GOOD_RECIPE + '\n[[runs]]\nid = "c"\n'
    recipe = load_recipe(write(tmp_path, text))
    assert len(recipe.runs) == 3 and recipe.trainer.max_concurrent_runs == 2


def test_orch_toml_unknown_key_is_an_error_with_line(tmp_path: Path):
    path = write(tmp_path, "lr = 0.1\n\n[sampling]\ntemp = 1\n", "orch.toml")
    error = problem_of(path, load_orchestrator_config)
    assert error.problems[0].key == "sampling.temp" and error.problems[0].line == 4


def test_missing_recipe_file_is_a_clear_error(tmp_path: Path):
    message = str(problem_of(tmp_path / "nope.toml"))
    assert "nope.toml" in message and "file not found" in message


def test_set_assignments_are_parsed_as_toml_values():
    assert parse_assignment("lr=1e-3") == ("lr", 1e-3)
    assert parse_assignment("sampling.temperature = 0.5") == ("sampling.temperature", 0.5)
    assert parse_assignment("env=reverse_text") == ("env", "reverse_text")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_assignment("lr")


def test_recipe_document_type_is_tomlkit(tmp_path: Path):
    document, _ = read_toml(write(tmp_path, GOOD_RECIPE))
    assert isinstance(document, tomlkit.TOMLDocument)


def test_inference_dtype_auto_follows_the_trainer_so_logprobs_agree(tmp_path: Path):
    recipe = load_recipe(write(tmp_path, GOOD_RECIPE + ""))
    assert recipe.inference_config().inference.dtype == recipe.trainer.dtype == "float32"
    text = GOOD_RECIPE.replace("[trainer]\n", '[inference]\ndtype = "bfloat16"\n\n[trainer]\n')
    assert load_recipe(write(tmp_path, text)).inference_config().inference.dtype == "bfloat16"


def test_training_temperature_0_is_refused_saying_greedy_completions_teach_nothing(
    tmp_path: Path,
):
    path = write(tmp_path, GOOD_RECIPE.replace("temperature = 0.7", "temperature = 0"))
    error = problem_of(path)
    assert [p.key for p in error.problems] == ["runs[1].sampling.temperature"]
    assert error.problems[0].line == 21
    assert "greedy decoding" in str(error) and "advantage" in str(error)
    # Greedy evals stay the default: the eval table has its own temperature.
    assert OrchestratorConfig().eval.sampling.temperature == 0
