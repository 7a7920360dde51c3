"""A `[sweep.scheduler]` with `kind = "pbt"` that cannot work is refused when the recipe
loads (before `workbench up` starts anything), naming the key and saying what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.config import ConfigError
from workbench.recipe import load_recipe
from workbench.sweep.spec import PbtSpec

HEAD = """\
[experiment]
name = "pbt"

[model]
base = "builtin:tiny-reverse"

[trainer]
max_concurrent_runs = 2
lora = { rank = 8 }

[defaults]
max_steps = 20
checkpoint_interval = 5

[defaults.eval]
interval = 5

"""
GRID = '[sweep]\ngrid.lr = [1e-3, 3e-3, 1e-2]\ngrid."lora.rank" = [4, 8]\n\n'


def load(tmp_path: Path, body: str):
    path = tmp_path / "recipe.toml"
    path.write_text(HEAD + body)
    return load_recipe(path)


def problems(tmp_path: Path, body: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, body)
    return [(p.key, p.message) for p in info.value.problems]


def test_a_pbt_sweep_perturbs_the_swept_keys_a_fork_can_change(tmp_path: Path):
    recipe = load(tmp_path, GRID + '[sweep.scheduler]\nkind = "pbt"\ninterval = 5\n')
    assert isinstance(recipe.sweep.scheduler, PbtSpec)
    assert recipe.sweep.scheduler.judged_steps(20) == [5, 10, 15]
    assert len(recipe.planned_runs) == 6


def test_a_pbt_sweep_with_nothing_to_perturb_is_refused_naming_the_scheduler_kind(
    tmp_path: Path,
):
    body = (
        '[sweep]\ngrid."lora.rank" = [4, 8]\nrepeats = 2\n\n[sweep.scheduler]\nkind = "pbt"\n'
        "interval = 5\n"
    )
    [(key, message)] = problems(tmp_path, body)
    assert key == "sweep.scheduler.kind"
    assert "nothing to perturb" in message and "lora.rank" in message and "grid.lr" in message


def test_an_empty_perturb_list_is_nothing_to_perturb(tmp_path: Path):
    body = GRID + '[sweep.scheduler]\nkind = "pbt"\ninterval = 5\nperturb = []\n'
    [(key, message)] = problems(tmp_path, body)
    assert key == "sweep.scheduler.perturb" and "nothing to perturb" in message


def test_perturb_names_only_swept_keys_a_fork_can_change(tmp_path: Path):
    body = GRID + '[sweep.scheduler]\nkind = "pbt"\ninterval = 5\nperturb = ["lora.rank", "seed"]\n'
    found = problems(tmp_path, body)
    assert (
        found[0][0] == "sweep.scheduler.perturb[0]" and "comes with the checkpoint" in found[0][1]
    )
    assert (
        found[1][0] == "sweep.scheduler.perturb[1]" and "not a key of [sweep.grid]" in found[1][1]
    )


@pytest.mark.parametrize(
    ("setting", "key", "words"),
    [
        ("quantile = 0.75", "sweep.scheduler.quantile", "less than or equal to 0.5"),
        ("quantile = 0", "sweep.scheduler.quantile", "greater than 0"),
        ("interval = 0", "sweep.scheduler.interval", "greater than or equal to 1"),
        ("factors = [1.0]", "sweep.scheduler", "nothing would change"),
        ("factors = [0.8, -1.2]", "sweep.scheduler", "above 0"),
        ("resample_probability = 1.5", "sweep.scheduler.resample_probability", "1"),
        ("min_runs = 1", "sweep.scheduler.min_runs", "greater than or equal to 2"),
        ('mode = "up"', "sweep.scheduler.mode", "'max' or 'min'"),
        ("intervall = 5", "sweep.scheduler.intervall", "did you mean 'interval'?"),
    ],
)
def test_bad_scheduler_values_are_refused_naming_the_key(
    tmp_path: Path, setting: str, key: str, words: str
):
    interval = "" if setting.startswith("interval") else "interval = 5\n"
    body = GRID + f'[sweep.scheduler]\nkind = "pbt"\n{interval}{setting}\n'
    if setting.startswith("intervall"):
        body = GRID + f'[sweep.scheduler]\nkind = "pbt"\ninterval = 5\n{setting}\n'
    found = problems(tmp_path, body)
    assert any(k == key and words in m for k, m in found), found


def test_a_missing_interval_is_refused(tmp_path: Path):
    found = problems(tmp_path, GRID + '[sweep.scheduler]\nkind = "pbt"\n')
    assert found == [("sweep.scheduler.interval", "required key is missing")]


def test_an_unknown_kind_is_refused(tmp_path: Path):
    [(key, message)] = problems(tmp_path, GRID + '[sweep.scheduler]\nkind = "hyperband"\n')
    assert key == "sweep.scheduler" and "'asha', 'pbt'" in message


def test_judged_steps_without_records_or_checkpoints_are_refused(tmp_path: Path):
    body = GRID + '[sweep.scheduler]\nkind = "pbt"\ninterval = 7\n'
    found = problems(tmp_path, body)
    messages = " | ".join(m for _, m in found)
    assert all(k == "sweep.scheduler.interval" for k, _ in found)
    assert "not a multiple of [defaults.eval] interval (5)" in messages
    assert "checkpoint_interval = 5 does not write those" in messages


def test_no_checkpoints_between_the_ends_is_refused(tmp_path: Path):
    body = GRID + '[sweep.scheduler]\nkind = "pbt"\ninterval = 5\n'
    with pytest.raises(ConfigError) as info:
        path = tmp_path / "recipe.toml"
        path.write_text(HEAD.replace("checkpoint_interval = 5", "checkpoint_interval = 0") + body)
        load_recipe(path)
    [problem] = info.value.problems
    assert problem.key == "sweep.scheduler.interval"
    assert "checkpoint_interval = 0 does not write those: set checkpoint_interval = 5" in (
        problem.message
    )


def test_an_interval_past_max_steps_and_too_few_runs_are_refused(tmp_path: Path):
    body = GRID + '[sweep.scheduler]\nkind = "pbt"\ninterval = 20\nmin_runs = 7\n'
    found = dict(problems(tmp_path, body))
    assert "no run would ever be judged" in found["sweep.scheduler.interval"]
    assert "the recipe has 6" in found["sweep.scheduler.min_runs"]


def test_an_eval_metric_with_evals_off_is_refused(tmp_path: Path):
    path = tmp_path / "recipe.toml"
    path.write_text(
        HEAD.replace("[defaults.eval]\ninterval = 5", "[defaults.eval]\ninterval = 0")
        + GRID
        + '[sweep.scheduler]\nkind = "pbt"\ninterval = 5\n'
    )
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    [problem] = info.value.problems
    assert problem.key == "sweep.scheduler.metric" and "turns evals off" in problem.message
