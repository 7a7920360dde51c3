"""A recipe's [sweep] table: what it expands to, in which order, under which ids, and
how a bad one is reported (file, line and key, every problem at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.config import ConfigError, OrchestratorConfig
from workbench.recipe import load_recipe
from workbench.sweep.expand import expand_sweep

HEAD = """\
[experiment]
name = "sweep"

[model]
base = "builtin:tiny-reverse"

[trainer]
max_concurrent_runs = 2

[defaults]
max_steps = 20
seed = 7
"""


def recipe_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(HEAD + body)
    return path


def load(tmp_path: Path, body: str):
    return load_recipe(recipe_file(tmp_path, body))


def problems(tmp_path: Path, body: str) -> ConfigError:
    path = recipe_file(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    return info.value


def line_of(path_text: str, needle: str) -> int:
    return next(n for n, line in enumerate(path_text.splitlines(), 1) if needle in line)


# ---------------------------------------------------------------- expansion


def test_grid_makes_every_combination_last_key_fastest_with_readable_ids(tmp_path: Path):
    recipe = load(tmp_path, "[sweep.grid]\nlr = [1e-3, 3e-3]\nlora.rank = [4, 8]\n")
    runs = recipe.planned_runs
    assert [run.run_id for run in runs] == [
        "run_lr1e-3_rank4",
        "run_lr1e-3_rank8",
        "run_lr3e-3_rank4",
        "run_lr3e-3_rank8",
    ]
    assert runs[1].values == {"lr": 1e-3, "lora.rank": 8}
    configs = recipe.run_configs()
    assert configs["run_lr3e-3_rank8"].lr == 3e-3
    assert configs["run_lr3e-3_rank8"].lora.rank == 8
    assert configs["run_lr3e-3_rank8"].max_steps == 20, "everything else comes from [defaults]"


def test_nested_keys_may_be_dotted_quoted_or_tables_alike(tmp_path: Path):
    forms = [
        "[sweep.grid]\nloss.kl_coef = [0.0, 0.01]\n",
        '[sweep.grid]\n"loss.kl_coef" = [0.0, 0.01]\n',
        "[sweep.grid.loss]\nkl_coef = [0.0, 0.01]\n",
        "[sweep]\ngrid = { loss = { kl_coef = [0.0, 0.01] } }\n",
    ]
    expanded = [[run.values for run in load(tmp_path, form).planned_runs] for form in forms]
    assert all(values == expanded[0] for values in expanded)
    assert expanded[0] == [{"loss.kl_coef": 0.0}, {"loss.kl_coef": 0.01}]


def test_sampling_and_env_args_keys_reach_the_run_config(tmp_path: Path):
    recipe = load(
        tmp_path,
        "[sweep.grid]\nsampling.temperature = [0.7]\nenv_args.max_length = [6, 9]\n",
    )
    configs = list(recipe.run_configs().values())
    assert [c.env_args for c in configs] == [{"max_length": 6}, {"max_length": 9}]
    assert all(c.sampling.temperature == 0.7 for c in configs)
    assert all(c.sampling.max_tokens == OrchestratorConfig().sampling.max_tokens for c in configs)
    assert list(recipe.run_configs()) == [
        "run_temperature0p7_max_length6",
        "run_temperature0p7_max_length9",
    ]


def test_repeats_vary_the_seed_and_run_every_configuration_once_before_any_twice(
    tmp_path: Path,
):
    recipe = load(tmp_path, "[sweep]\nrepeats = 2\n\n[sweep.grid]\nlr = [1e-3, 3e-3]\n")
    runs = recipe.planned_runs
    assert [run.run_id for run in runs] == [
        "run_lr1e-3_seed7",
        "run_lr3e-3_seed7",
        "run_lr1e-3_seed8",
        "run_lr3e-3_seed8",
    ]
    assert [recipe.run_configs()[run.run_id].seed for run in runs] == [7, 7, 8, 8]


def test_repeats_alone_are_seeds_of_the_defaults(tmp_path: Path):
    runs = load(tmp_path, "[sweep]\nrepeats = 3\n").planned_runs
    assert [(run.run_id, run.values) for run in runs] == [
        ("run_seed7", {"seed": 7}),
        ("run_seed8", {"seed": 8}),
        ("run_seed9", {"seed": 9}),
    ]


RANDOM = """\
[sweep]
num_samples = 6
seed = {seed}

[sweep.random]
lr = {{ distribution = "log_uniform", low = 1e-5, high = 1e-2 }}
"sampling.temperature" = {{ distribution = "uniform", low = 0.5, high = 1.5 }}
"lora.rank" = {{ distribution = "choice", values = [4, 8] }}
max_steps = {{ distribution = "int", low = 5, high = 40 }}

"""


def test_random_draws_stay_within_their_distributions(tmp_path: Path):
    recipe = load(tmp_path, RANDOM.format(seed=0))
    runs = recipe.planned_runs
    assert len(runs) == 6
    for run in runs:
        assert 1e-5 <= run.values["lr"] <= 1e-2
        assert 0.5 <= run.values["sampling.temperature"] <= 1.5
        assert run.values["lora.rank"] in (4, 8)
        assert 5 <= run.values["max_steps"] <= 40 and isinstance(run.values["max_steps"], int)
    assert len({run.values["lr"] for run in runs}) == 6, "every sample draws anew"


def test_random_draws_are_reproducible_and_follow_the_seed(tmp_path: Path):
    first = [r.values for r in load(tmp_path, RANDOM.format(seed=0)).planned_runs]
    again = [r.values for r in load(tmp_path, RANDOM.format(seed=0)).planned_runs]
    other = [r.values for r in load(tmp_path, RANDOM.format(seed=1)).planned_runs]
    assert first == again
    assert first != other


def test_adding_a_random_key_leaves_the_other_keys_draws_alone(tmp_path: Path):
    one = "[sweep]\nnum_samples = 4\n\n[sweep.random]\n"
    lr = 'lr = { distribution = "log_uniform", low = 1e-5, high = 1e-2 }\n'
    top_p = '"sampling.top_p" = { distribution = "uniform", low = 0.5, high = 1.0 }\n'
    alone = [r.values["lr"] for r in load(tmp_path, one + lr).planned_runs]
    both = [r.values["lr"] for r in load(tmp_path, one + lr + top_p).planned_runs]
    assert alone == both


def test_random_samples_combine_with_every_grid_point(tmp_path: Path):
    body = (
        "[sweep]\nnum_samples = 2\n\n[sweep.grid]\nlr = [1e-3, 3e-3]\n\n[sweep.random]\n"
        '"sampling.temperature" = { distribution = "uniform", low = 0.5, high = 1.5 }\n'
    )
    runs = load(tmp_path, body).planned_runs
    assert [r.values["lr"] for r in runs] == [1e-3, 3e-3, 1e-3, 3e-3]
    temperatures = [r.values["sampling.temperature"] for r in runs]
    assert temperatures[0] == temperatures[1] != temperatures[2] == temperatures[3]


def test_sweep_runs_queue_after_the_explicit_runs(tmp_path: Path):
    body = (
        '[[runs]]\nid = "baseline"\n\n[[runs]]\nid = "hot"\nsampling = { temperature = 1.5 }\n\n'
        "[sweep.grid]\nlr = [1e-3, 3e-3]\n"
    )
    recipe = load(tmp_path, body)
    runs = recipe.planned_runs
    assert [(r.run_id, r.source) for r in runs] == [
        ("run_baseline", "runs"),
        ("run_hot", "runs"),
        ("run_lr1e-3", "sweep"),
        ("run_lr3e-3", "sweep"),
    ]
    assert runs[1].values == {"sampling.temperature": 1.5}
    assert list(recipe.run_configs()) == [r.run_id for r in runs]


def test_ids_are_stable_across_loads_and_independent_of_explicit_runs(tmp_path: Path):
    grid = "[sweep.grid]\nlr = [1e-4, 0.05, 2.5]\n"
    alone = [r.run_id for r in load(tmp_path, grid).planned_runs]
    with_runs = [
        r.run_id
        for r in load(tmp_path, '[[runs]]\nid = "x"\n\n' + grid).planned_runs
        if r.source == "sweep"
    ]
    assert alone == with_runs == ["run_lr1e-4", "run_lr0p05", "run_lr2p5"]


def test_values_that_do_not_fit_an_id_fall_back_to_a_short_index(tmp_path: Path):
    body = "[sweep.grid]\nenv_args = [{ max_length = 6 }, { max_length = 9, min_length = 3 }]\n"
    runs = load(tmp_path, body).planned_runs
    assert [r.run_id for r in runs] == ["run_sweep00", "run_sweep01"]
    assert runs[1].values == {"env_args": {"max_length": 9, "min_length": 3}}


def test_index_ids_on_request(tmp_path: Path):
    body = '[sweep]\nids = "index"\n\n[sweep.grid]\nlr = [1e-3, 3e-3]\n'
    assert [r.run_id for r in load(tmp_path, body).planned_runs] == [
        "run_sweep00",
        "run_sweep01",
    ]


def test_a_sweep_with_only_a_scheduler_adds_no_runs(tmp_path: Path):
    recipe = load(tmp_path, '[[runs]]\nid = "a"\n\n[sweep.scheduler]\nkind = "asha"\n')
    assert [r.run_id for r in recipe.planned_runs] == ["run_a"]
    assert recipe.sweep is not None and recipe.sweep.scheduler is not None


def test_expand_sweep_matches_what_the_recipe_loaded(tmp_path: Path):
    recipe = load(tmp_path, "[sweep]\nrepeats = 2\n\n[sweep.grid]\nlr = [1e-3, 3e-3]\n")
    assert recipe.sweep is not None
    runs = expand_sweep(recipe.sweep, recipe.defaults.model_dump(mode="json"))
    assert [r.run_id for r in runs] == [spec.run_id for spec in recipe.runs]


# ---------------------------------------------------------------- errors


def test_unknown_key_names_file_line_and_the_likely_key(tmp_path: Path):
    error = problems(tmp_path, "[sweep.grid]\nlr = [1e-3]\ntemperature = [0.7]\n")
    message = str(error)
    text = recipe_file(tmp_path, "[sweep.grid]\nlr = [1e-3]\ntemperature = [0.7]\n").read_text()
    assert str(tmp_path / "recipe.toml") in message
    assert f"line {line_of(text, 'temperature =')}: sweep.grid.temperature: unknown key" in message
    assert "did you mean 'sampling.temperature'?" in message


def test_unknown_nested_key_and_a_key_below_a_single_value(tmp_path: Path):
    error = problems(tmp_path, "[sweep.grid]\nlora.rnak = [4]\nlr.low = [1]\n")
    by_key = {p.key: p.message for p in error.problems}
    assert "did you mean 'lora.rank'?" in by_key["sweep.grid.lora.rnak"]
    assert "lr is a single value, not a table" in by_key["sweep.grid.lr.low"]


def test_empty_grid_and_a_value_that_is_not_a_list(tmp_path: Path):
    error = problems(tmp_path, "[sweep.grid]\nlr = []\nseed = 3\n")
    by_key = {p.key: p.message for p in error.problems}
    assert "empty list" in by_key["sweep.grid.lr"]
    assert (
        "must be a list of values" in by_key["sweep.grid.seed"]
        and "(got 3)" in by_key["sweep.grid.seed"]
    )


def test_each_grid_value_is_checked_as_the_runs_config(tmp_path: Path):
    body = "[sweep.grid]\nlr = [1e-3, -1]\n"
    error = problems(tmp_path, body)
    [problem] = error.problems
    assert problem.key == "sweep.grid.lr"
    assert problem.line == line_of(HEAD + body, "lr = [")
    assert "value 2 of 2 (-1)" in problem.message and "greater than 0" in problem.message


def test_swept_values_are_checked_as_the_keys_they_set_each_at_its_line(tmp_path: Path):
    body = (
        "[sweep.grid]\nlr = [1e-3, inf]\n"
        '"optim.betas" = [[0.9, 0.999], [1.5, 0.999]]\n'
        "rollouts_per_prompt = [1, 8]\n"
    )
    error = problems(tmp_path, body)
    by_key = {p.key: p for p in error.problems}
    text = HEAD + body
    assert by_key["sweep.grid.lr"].line == line_of(text, "lr = [")
    assert "value 2 of 2 (inf): must be a finite number" in by_key["sweep.grid.lr"].message
    betas = by_key["sweep.grid.optim.betas"]
    assert betas.line == line_of(text, '"optim.betas"')
    assert "value 2 of 2 ([1.5, 0.999]): beta1 = 1.5 is outside [0, 1)" in betas.message
    groups = by_key["sweep.grid.rollouts_per_prompt"]
    assert "value 1 of 2 (1): 1 makes groups of one completion" in groups.message


def test_bad_distributions_are_named_with_their_key(tmp_path: Path):
    body = (
        "[sweep]\nnum_samples = 2\n\n[sweep.random]\n"
        'lr = { distribution = "log-uniform", low = 1e-4, high = 1e-2 }\n'
        '"loss.kl_coef" = { distribution = "uniform", low = 0.5, high = 0.1 }\n'
        '"lora.rank" = { distribution = "int", low = 0, high = 8 }\n'
        '"sampling.top_p" = { low = 0.5, high = 1.0 }\n'
        '"optim.eps" = { distribution = "log_uniform", low = 0.0, high = 1e-6 }\n'
        '"sampling.temperature" = { distribution = "choice", values = [] }\n'
    )
    error = problems(tmp_path, body)
    by_key = {p.key: p.message for p in error.problems}
    assert "did you mean 'log_uniform'?" in by_key["sweep.random.lr.distribution"]
    assert "low (0.5) must be below high (0.1)" in by_key["sweep.random.loss.kl_coef"]
    assert "low = 0: Input should be greater than or equal to 1" in by_key["sweep.random.lora.rank"]
    assert "missing distribution" in by_key["sweep.random.sampling.top_p"]
    assert "greater than 0" in by_key["sweep.random.optim.eps.low"]
    assert "at least 1 item" in by_key["sweep.random.sampling.temperature.values"]
    text = HEAD + body
    assert error.problems[0].line == line_of(text, "lr = {")


def test_a_swept_rank_above_the_trainers_slots_is_an_error(tmp_path: Path):
    error = problems(tmp_path, "[sweep.grid]\nlora.rank = [4, 16]\n")
    [problem] = error.problems
    assert problem.key == "sweep.grid.lora.rank"
    assert "rank 16 is larger than the trainer's adapter slots ([trainer] lora.rank = 8)" in (
        problem.message
    )
    body = "[trainer.lora]\nrank = 16\n\n[sweep.grid]\nlora.rank = [4, 16]\n"
    assert len(load(tmp_path, body).planned_runs) == 2


def test_too_many_runs_is_an_error_that_shows_the_arithmetic(tmp_path: Path):
    body = "[sweep]\nrepeats = 3\n\n[sweep.grid]\nlr = [1, 2, 3, 4, 5]\nseed = [1, 2, 3, 4, 5]\n"
    error = problems(tmp_path, body.replace("seed", "max_steps"))
    [problem] = error.problems
    assert "75 runs (5 lr x 5 max_steps x 3 repeats), more than max_runs = 64" in problem.message
    assert problem.key == "sweep"


def test_max_runs_itself_has_a_ceiling(tmp_path: Path):
    error = problems(tmp_path, "[sweep]\nmax_runs = 5000\n")
    assert error.problems[0].key == "sweep.max_runs"
    assert "less than or equal to 1000" in error.problems[0].message


def test_rules_across_keys_are_checked_on_every_expanded_run(tmp_path: Path):
    body = "[sweep.grid]\nbatch_size = [64, 60]\nrollouts_per_prompt = [8]\n"
    error = problems(tmp_path, body)
    [problem] = error.problems
    assert problem.key == "sweep"
    assert "run 2 (batch_size=60 rollouts_per_prompt=8)" in problem.message
    assert "must be a multiple of rollouts_per_prompt" in problem.message


def test_the_same_configuration_twice_is_an_error(tmp_path: Path):
    error = problems(tmp_path, "[sweep.grid]\nlr = [1e-3, 0.001]\n")
    assert "runs 1 and 2 have the same configuration" in str(error)


def test_a_sweep_id_that_an_explicit_run_already_has(tmp_path: Path):
    error = problems(tmp_path, '[[runs]]\nid = "lr1e-3"\n\n[sweep.grid]\nlr = [1e-3, 3e-3]\n')
    [problem] = error.problems
    assert (
        problem.key == "runs[0].id" and "the sweep also makes a run 'run_lr1e-3'" in problem.message
    )


def test_conflicting_settings_of_the_sweep(tmp_path: Path):
    body = (
        "[sweep]\nrepeats = 2\n\n[sweep.grid]\nseed = [1, 2]\nlora = [{ rank = 4 }]\n"
        '"lora.alpha" = [8.0]\n'
    )
    messages = " | ".join(p.message for p in problems(tmp_path, body).problems)
    assert "repeats already vary the seed" in messages
    assert "overlaps 'lora'" in messages
    assert "needs num_samples" in str(
        problems(
            tmp_path,
            '[sweep.random]\nlr = { distribution = "uniform", low = 0.1, high = 0.2 }\n',
        )
    )
    assert "use repeats" in str(problems(tmp_path, "[sweep]\nnum_samples = 3\n"))


def test_every_problem_of_the_recipe_is_reported_at_once(tmp_path: Path):
    body = (
        '[[runs]]\nid = "a b"\n\n[sweep]\nids = "names"\n\n[sweep.grid]\nlr = [-1]\nbogus = [1]\n'
        '\n[sweep.scheduler]\nkind = "asha"\ngrace = 2\n'
    )
    keys = {p.key for p in problems(tmp_path, body).problems}
    assert {
        "runs[0].id",
        "sweep.ids",
        "sweep.grid.lr",
        "sweep.grid.bogus",
        "sweep.scheduler.grace",
    } <= keys


def test_unknown_scheduler_key_lists_the_allowed_ones(tmp_path: Path):
    error = problems(tmp_path, '[sweep.scheduler]\nkind = "asha"\nmetrc = "reward_mean"\n')
    [problem] = error.problems
    assert problem.key == "sweep.scheduler.metrc"
    assert "did you mean 'metric'?" in problem.message and "grace_steps" in problem.message
