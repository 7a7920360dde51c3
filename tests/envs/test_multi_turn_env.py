"""Multi-turn environments: `reverse_chain`'s turns and episode reward, and `reverse_text`'s
earlier turns (what warms a model up to answer in a conversation)."""

from __future__ import annotations

import pytest

from workbench.envs import EnvironmentConfigError, MultiTurnEnvironment, get_environment


def test_a_chain_asks_one_text_per_turn_then_ends():
    env = get_environment("reverse_chain", turns=3)
    assert isinstance(env, MultiTurnEnvironment) and env.max_turns == 3
    prompt = env.prompt(0, seed=1)
    texts = prompt.info["texts"]
    assert prompt.question == texts[0] and len(texts) == 3
    assert env.respond(prompt, ["x"]) == texts[1]
    assert env.respond(prompt, ["x", "y"]) == texts[2]
    assert env.respond(prompt, ["x", "y", "z"]) is None


def test_the_episode_reward_averages_every_turn_and_counts_a_missing_turn_as_zero():
    env = get_environment("reverse_chain", turns=2, min_length=4, max_length=4)
    prompt = env.prompt(3)
    first, second = (text[::-1] for text in prompt.info["texts"])
    assert env.episode_reward(prompt, [first, second]) == 1.0
    assert env.episode_reward(prompt, [first, ""]) == 0.5
    assert env.episode_reward(prompt, [first]) == 0.5  # the episode ended early
    assert env.reward(prompt, first) == 0.5  # one reply is a one-turn episode


def test_chains_hold_out_whole_episodes_for_evaluation():
    env = get_environment("reverse_chain")
    train = {"\n".join(p.info["texts"]) for p in env.sample_prompts(300)}
    held_out = {"\n".join(p.info["texts"]) for p in env.sample_prompts(50, split="eval")}
    assert held_out and not train & held_out


def test_reverse_text_with_history_puts_answered_turns_before_the_text():
    env = get_environment("reverse_text", min_length=3, max_length=5, max_history=2)
    prompts = env.sample_prompts(60, seed=2)
    lengths = {len(p.messages) for p in prompts}
    assert lengths == {1, 3, 5}  # 0, 1 or 2 earlier turns
    for prompt in prompts:
        messages = prompt.messages
        assert messages[-1] == {"role": "user", "content": prompt.question}
        for user, assistant in zip(messages[:-1:2], messages[1:-1:2], strict=True):
            assert assistant["content"] == user["content"][::-1]


def test_reverse_text_without_history_draws_the_same_prompts_as_before():
    plain = get_environment("reverse_text").sample_prompts(30, seed=5)
    explicit = get_environment("reverse_text", max_history=0).sample_prompts(30, seed=5)
    assert plain == explicit
    assert all(p.chat is None for p in plain)


def test_a_chain_too_long_is_refused():
    with pytest.raises(EnvironmentConfigError, match="turns"):
        get_environment("reverse_chain", turns=9)
