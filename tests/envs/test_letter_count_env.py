"""letter_count's two answers: the count in digits (the default, exact match) and the letter
written as many times as it occurs (`answer = "letters"`, difflib similarity), which the
built-in tiny model can write and learn."""

from __future__ import annotations

import difflib

import pytest

from workbench.envs import EnvironmentConfigError, get_environment


@pytest.fixture
def letters():
    return get_environment("letter_count", answer="letters", alphabet="abc", max_length=8)


def test_digits_stay_the_default_answer():
    env = get_environment("letter_count")
    prompt = env.prompt(0)
    assert env.args.answer == "digits"
    assert prompt.system_prompt.startswith("count how many times the letter occurs")
    assert prompt.answer == str(prompt.info["count"])


def test_a_letters_answer_is_the_letter_as_many_times_as_it_occurs(letters):
    prompts = letters.sample_prompts(200, seed=0)
    for prompt in prompts:
        word, letter = prompt.info["word"], prompt.info["letter"]
        assert prompt.messages == [{"role": "user", "content": f"{word} {letter}"}]
        assert prompt.answer == letter * word.count(letter)
        assert prompt.info["count"] >= 1  # always a letter of the word: never an empty answer
    # Three letters in words of 3 to 8: counts vary, so the answer is not one length.
    assert len({len(p.answer) for p in prompts}) >= 4


def test_a_letters_reward_is_graded_towards_the_right_count(letters):
    prompt = next(p for p in letters.sample_prompts(100, seed=1) if p.info["count"] == 3)
    letter = prompt.info["letter"]
    assert letters.reward(prompt, letter * 3) == 1.0
    assert letters.reward(prompt, f" {letter * 3}\n") == 1.0
    assert letters.reward(prompt, f"<think>count</think>{letter * 3}") == 1.0
    # One letter off is close, two off less so, and the reversed message (where the tiny
    # model starts) earns partial credit: a gradient towards the right count.
    one_off, two_off = letters.reward(prompt, letter * 4), letters.reward(prompt, letter * 1)
    reversed_message = letters.reward(prompt, prompt.question[::-1])
    assert 1.0 > one_off > two_off > 0.0
    assert 0.0 < reversed_message < 1.0
    expected = difflib.SequenceMatcher(None, prompt.question[::-1].strip(), letter * 3).ratio()
    assert reversed_message == pytest.approx(expected)
    assert letters.reward(prompt, "") == 0.0
    assert letters.reward(prompt, "  \n") == 0.0


def test_letters_send_no_system_prompt_unless_one_is_given():
    env = get_environment("letter_count", answer="letters")
    assert env.prompt(0).messages[0]["role"] == "user"
    given = get_environment("letter_count", answer="letters", system_prompt="repeat the letter")
    assert given.prompt(0).messages[0] == {"role": "system", "content": "repeat the letter"}


def test_letters_prompts_are_seeded_resumable_and_held_out(letters):
    prompts = letters.sample_prompts(30, seed=4)
    assert prompts == letters.sample_prompts(30, seed=4)
    assert letters.sample_prompts(10, seed=4, start=20) == prompts[20:]
    train = {p.question for p in letters.sample_prompts(300, seed=4)}
    held_out = {p.question for p in letters.sample_prompts(300, seed=4, split="eval")}
    assert not train & held_out


def test_an_unknown_answer_kind_is_named_with_the_allowed_ones():
    with pytest.raises(EnvironmentConfigError, match="answer") as err:
        get_environment("letter_count", answer="words")
    assert "digits" in str(err.value) and "letters" in str(err.value)
