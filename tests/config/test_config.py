"""Recipes and orch.toml: round trips keep comments; bad input names file, line and key."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import tomlkit
from pydantic import BaseModel

from workbench.config import (
    ConfigError,
    OrchestratorConfig,
    load_orchestrator_config,
    parse_assignment,
    read_toml,
    tagged_members,
)
from workbench.experiment import create_experiment
from workbench.files import layout
from workbench.recipe import Recipe, load_recipe

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

    from workbench.supervisor.devices import assign_devices
    from workbench.trainer.compute.attention_choice import AttentionRuntime, resolve_attention

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


# ---------------------------------------------------------------- numbers


def test_a_key_written_twice_in_a_run_is_an_error_at_its_second_line(tmp_path: Path):
    # tomlkit raises another error than for a key repeated elsewhere, with no line of its own
    path = write(tmp_path, GOOD_RECIPE.replace("lr = 1e-3", "lr = 1e-3\nlr = 3e-3"))
    [problem] = problem_of(path).problems
    assert problem.line == 21 and 'Key "lr" already exists' in problem.message


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def float_keys(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every float setting of a config model, by key path: found by walking the models, so a
    float field added later is covered too (plain, optional, in a tuple, or of any kind of a
    table of several kinds, `loss`)."""
    keys = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        members = typing.get_args(annotation) or (annotation,)
        nested = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        nested = nested[:1] or list(tagged_members(annotation).values())
        for inner in nested:
            keys += [key for key in float_keys(inner, (*prefix, name)) if key not in keys]
        if not nested and float in members:
            keys.append((*prefix, name))
    return keys


RECIPE_FLOATS = [
    (section, *key)
    for section in ("inference", "trainer", "defaults", "tracking")
    for key in float_keys(Recipe.model_fields[section].annotation)
]


def test_the_walk_finds_the_float_settings_a_user_meets():
    found = {".".join(key) for key in RECIPE_FLOATS}
    assert {
        "defaults.lr",
        "defaults.optim.betas",
        "defaults.optim.eps",
        "defaults.optim.weight_decay",
        "defaults.optim.max_norm",
        "defaults.sampling.temperature",
        "defaults.sampling.top_p",
        "defaults.eval.sampling.temperature",
        "defaults.loss.kl_coef",
        "defaults.loss.eps_high",
        "defaults.loss.weight_low",
        "defaults.scheduler.min_lr_ratio",
        "defaults.lora.alpha",
        "trainer.lora.alpha",
        "trainer.poll_interval_s",
        "inference.startup_timeout_s",
        "inference.gpu_memory_utilization",
    } <= found


def _field_at(model: type[BaseModel], path: list[str]) -> tuple[typing.Any, str | None]:
    """The field at a key path, and the `kind` a table of several kinds must name for it."""
    kind = None
    for part in path:
        kinds = tagged_members(model)
        if kinds:
            kind, model = next((t, m) for t, m in kinds.items() if part in m.model_fields)
        model = model.model_fields[part].annotation
    return model, kind


@pytest.mark.parametrize("spelled", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("key", RECIPE_FLOATS, ids=".".join)
def test_no_float_setting_takes_inf_or_nan(tmp_path: Path, key: tuple[str, ...], spelled: str):
    section, *inner = key
    annotation, kind = _field_at(Recipe.model_fields[section].annotation, inner)
    value = f"[0.9, {spelled}]" if typing.get_origin(annotation) is tuple else spelled
    text = f'[model]\nbase = "builtin:tiny-reverse"\n\n[{section}]\n{".".join(inner)} = {value}\n'
    if kind is not None:
        text += f'{".".join(inner[:-1])}.kind = "{kind}"\n'
    error = problem_of(write(tmp_path, text))
    [problem] = error.problems
    assert problem.key.startswith(".".join(key)) and problem.line == 5
    assert f"must be a finite number (got {spelled})" in problem.message


def test_a_run_or_a_sweep_value_of_inf_is_found_at_its_own_line(tmp_path: Path):
    text = GOOD_RECIPE.replace("lr = 1e-3", "lr = inf") + "\n[sweep.grid]\nlr = [1e-3, nan]\n"
    error = problem_of(write(tmp_path, text))
    by_key = {p.key: p for p in error.problems}
    assert by_key["runs[1].lr"].line == line_of(text, "lr = inf")
    assert by_key["sweep.grid.lr"].line == line_of(text, "lr = [1e-3, nan]")
    assert "value 2 of 2 (nan): must be a finite number" in by_key["sweep.grid.lr"].message


def test_sweep_distribution_bounds_are_finite(tmp_path: Path):
    text = GOOD_RECIPE + (
        '\n[sweep]\nnum_samples = 2\n\n[sweep.random]\n"loss.kl_coef" = '
        '{ distribution = "uniform", low = 0.0, high = inf }\n'
    )
    [problem] = problem_of(write(tmp_path, text)).problems
    assert problem.key == "sweep.random.loss.kl_coef.high"
    assert problem.line == line_of(text, '"loss.kl_coef"')
    assert "must be a finite number (got inf)" in problem.message


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("optim = { betas = [1.5, 0.999] }", "beta1 = 1.5 is outside [0, 1), where AdamW takes it"),
        ("optim = { betas = [0.9, 1.0] }", "beta2 = 1 is outside [0, 1)"),
        ("optim = { betas = [-0.1, 0.999] }", "beta1 = -0.1 is outside [0, 1)"),
        ("optim = { eps = 0.0 }", "greater than 0"),
        ("optim = { weight_decay = -0.01 }", "greater than or equal to 0"),
        ("lr = 0.0", "greater than 0"),
        ("scheduler = { min_lr_ratio = 1.5 }", "less than or equal to 1"),
        ("loss = { mask_ratio_low = 1.0 }", "less than 1"),
    ],
)
def test_optimizer_and_loss_numbers_are_bounded_as_torch_and_the_loss_take_them(
    tmp_path: Path, setting: str, expected: str
):
    path = write(tmp_path, GOOD_RECIPE.replace("lr = 1e-3", setting))
    [problem] = problem_of(path).problems
    assert problem.key.startswith(f"runs[1].{setting.split()[0]}") and problem.line == 20
    assert expected in problem.message


def test_groups_of_one_completion_are_refused_saying_nothing_is_learnt(tmp_path: Path):
    path = write(tmp_path, GOOD_RECIPE.replace("lr = 1e-3", "lr = 1e-3\nrollouts_per_prompt = 1"))
    [problem] = problem_of(path).problems
    assert problem.key == "runs[1].rollouts_per_prompt" and problem.line == 21
    assert "every advantage is 0" in problem.message and "learns nothing" in problem.message
    # One eval completion per prompt stays the default: evals need no group.
    assert OrchestratorConfig().eval.rollouts_per_prompt == 1
    with pytest.raises(ValueError, match="groups of one completion"):
        OrchestratorConfig(batch_size=8, rollouts_per_prompt=1)


def test_trainer_numbers_that_would_stop_it_are_refused(tmp_path: Path):
    text = GOOD_RECIPE.replace(
        "max_concurrent_runs = 2",
        "max_concurrent_runs = 2\npoll_interval_s = 1e10\ntarget_modules = []",
    )
    by_key = {p.key: p for p in problem_of(write(tmp_path, text)).problems}
    assert by_key["trainer.poll_interval_s"].line == line_of(text, "poll_interval_s")
    assert "less than or equal to 60" in by_key["trainer.poll_interval_s"].message
    assert "at least 1 item" in by_key["trainer.target_modules"].message
