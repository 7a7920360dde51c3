"""The environment interface and registry: a second environment works through the same calls,
and every configuration mistake names the environment, the key and what is allowed."""

from __future__ import annotations

import random

import pytest

from workbench.envs import (
    Environment,
    EnvironmentConfigError,
    Prompt,
    Task,
    environment_names,
    get_environment,
    register_environment,
    registry,
)


def test_both_builtin_environments_are_registered():
    assert {"reverse_text", "letter_count"} <= set(environment_names())


def test_letter_count_works_through_the_same_interface():
    env = get_environment("letter_count", min_length=5, max_length=8)
    prompts = env.sample_prompts(50, seed=1)
    prompt = prompts[0]
    word, letter = prompt.info["word"], prompt.info["letter"]
    assert prompt.answer == str(word.count(letter))
    assert prompt.messages[0]["role"] == "system"  # this one has a system prompt
    assert prompt.messages[1] == {"role": "user", "content": f"letter: {letter}\nword: {word}"}
    assert env.reward(prompt, prompt.answer) == 1.0
    assert env.reward(prompt, f"the answer is {prompt.answer}.") == 1.0
    assert env.reward(prompt, str(int(prompt.answer) + 1)) == 0.0
    assert env.reward(prompt, "no idea") == 0.0
    assert env.parse_answer("<think>3? no, 2</think> 2") == "2"
    # Resumable in the same way as every environment.
    assert env.sample_prompts(10, seed=1, start=40) == prompts[40:]
    # Both zero and non-zero counts occur, so the task is not trivial.
    assert {p.answer == "0" for p in prompts} == {True, False}


def test_an_unknown_environment_lists_the_available_ones():
    with pytest.raises(EnvironmentConfigError, match=r"unknown environment 'revers_text'.*"):
        get_environment("revers_text")
    with pytest.raises(EnvironmentConfigError, match="reverse_text"):
        get_environment("revers_text")


def test_an_unknown_env_arg_is_named_with_the_allowed_ones():
    with pytest.raises(EnvironmentConfigError) as err:
        get_environment("reverse_text", max_len=5)
    assert "'max_len'" in str(err.value)
    assert "max_length" in str(err.value)


def test_inconsistent_or_mistyped_env_args_are_rejected():
    with pytest.raises(EnvironmentConfigError, match="min_length"):
        get_environment("reverse_text", min_length=9, max_length=3)
    with pytest.raises(EnvironmentConfigError, match="max_length"):
        get_environment("reverse_text", max_length="long")


class ConstantEnv(Environment):
    """An out-of-tree environment: the answer is always 'yes'."""

    name = "always_yes"

    def make_task(self, rng: random.Random) -> Task:
        return Task(question=f"question {rng.randint(0, 99)}", answer="yes")

    def parse_answer(self, completion: str) -> str | None:
        return completion.strip() or None

    def score(self, parsed_answer: str | None, prompt: Prompt) -> float:
        return 2.0 if parsed_answer == prompt.answer else -1.0  # out of range on purpose


def test_an_environment_can_be_named_by_import_path():
    env = get_environment(f"{__name__}:ConstantEnv")
    assert isinstance(env, ConstantEnv)
    assert env.prompt(0).answer == "yes"


def test_rewards_are_clamped_to_the_unit_interval():
    env = ConstantEnv()
    assert env.reward(env.prompt(0), "yes") == 1.0
    assert env.reward(env.prompt(0), "no") == 0.0


def test_an_import_path_that_is_not_an_environment_is_rejected():
    with pytest.raises(EnvironmentConfigError, match="not an Environment subclass"):
        get_environment("random:Random")
    with pytest.raises(EnvironmentConfigError, match="cannot import"):
        get_environment("no_such_module_here:Env")


def test_registering_makes_an_environment_available_by_name(monkeypatch):
    # On a copy of the registry: the environment stays out of every later test (the README's
    # generated key reference lists the registered environments).
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_environment(ConstantEnv)
    assert isinstance(get_environment("always_yes"), ConstantEnv)
    assert register_environment(ConstantEnv) is ConstantEnv  # idempotent


def test_a_negative_index_is_refused():
    with pytest.raises(IndexError):
        get_environment("reverse_text").prompt(-1)
