"""The eval split is held out: no eval prompt is ever a training prompt, whatever the seed.

Before the split was made disjoint by construction, the two streams were merely seeded
differently and met over small task spaces: `letter_count` with its defaults shared 3 of its
first 5000 eval questions with the first 5000 training ones, `reverse_text` on the tiny
model's 3-8 letter warm-up texts 42.
"""

from __future__ import annotations

import pytest

from workbench.envs import EnvironmentConfigError, get_environment
from workbench.envs.splits import split_of

FIRST = 3000
TASK_SPACES = [
    ("reverse_text", {}),
    ("reverse_text", {"min_length": 9, "max_length": 9}),  # the shipped recipe
    ("reverse_text", {"min_length": 3, "max_length": 8}),  # the tiny model's warm-up texts
    ("letter_count", {}),
    ("letter_count", {"min_length": 1, "max_length": 3}),  # a few thousand tasks in all
]


def questions(env, split: str, seed: int) -> set[str]:
    return {p.question for p in env.sample_prompts(FIRST, seed=seed, split=split)}


@pytest.mark.parametrize(("name", "env_args"), TASK_SPACES)
def test_eval_prompts_never_coincide_with_training_prompts(name, env_args):
    env = get_environment(name, **env_args)
    held_out = {seed: questions(env, "eval", seed) for seed in (0, 1)}
    for seed in (0, 1):
        train = questions(env, "train", seed)
        # Neither the same seed's training stream nor another seed's holds an eval question.
        assert not train & held_out[0], f"{name} {env_args} seed {seed}"
        assert not train & held_out[1], f"{name} {env_args} seed {seed}"


def test_the_eval_stream_is_a_varied_reproducible_sample_not_one_repeated_prompt():
    env = get_environment("letter_count")
    prompts = env.sample_prompts(200, seed=3, split="eval")
    assert len({p.question for p in prompts}) > 190
    assert prompts == get_environment("letter_count").sample_prompts(200, seed=3, split="eval")
    assert all(p.split == "eval" and split_of(p.question) == "eval" for p in prompts)


def test_a_task_space_too_small_to_hold_out_part_of_it_is_a_clear_error():
    # One task in all ("a"): it belongs to exactly one split, and the other split is empty.
    env = get_environment("reverse_text", min_length=1, max_length=1, alphabet="a")
    empty = "train" if split_of("a") == "eval" else "eval"
    assert env.prompt(0, split=split_of("a")).question == "a"
    with pytest.raises(EnvironmentConfigError, match=f"no '{empty}' prompt.*too small"):
        env.prompt(0, split=empty)


def test_an_unknown_split_is_refused():
    with pytest.raises(ValueError, match="unknown split 'test'"):
        get_environment("reverse_text").prompt(0, split="test")
