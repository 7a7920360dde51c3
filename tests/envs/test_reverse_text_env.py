"""reverse_text: the reward is difflib's similarity ratio to the exact reversal; prompts are
seeded, reproducible and resumable from a data position."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys

import pytest

from workbench.envs import Prompt, get_environment


@pytest.fixture
def env():
    return get_environment("reverse_text", min_length=6, max_length=12)


def test_the_exact_reversal_earns_full_reward(env):
    prompt = env.prompt(0)
    assert prompt.answer == prompt.question[::-1]
    assert env.reward(prompt, prompt.question[::-1]) == 1.0


def test_an_empty_or_blank_completion_earns_nothing(env):
    prompt = env.prompt(0)
    assert env.reward(prompt, "") == 0.0
    assert env.reward(prompt, "   \n") == 0.0


def test_a_partial_reversal_earns_partial_reward_equal_to_difflib_ratio(env):
    prompt = env.prompt(3)
    reversal = prompt.question[::-1]
    partial = reversal[: len(reversal) // 2]
    expected = difflib.SequenceMatcher(None, partial, reversal).ratio()
    assert 0.0 < env.reward(prompt, partial) < 1.0
    assert env.reward(prompt, partial) == pytest.approx(expected)
    # Not reversing at all is worse than reversing (for a text that is not a palindrome).
    assert env.reward(prompt, prompt.question) < 1.0


def test_the_parser_ignores_surrounding_whitespace_reasoning_and_answer_tags(env):
    assert env.parse_answer("  cba \n") == "cba"
    assert env.parse_answer("<think>reverse abc... c, b, a</think>\ncba") == "cba"
    assert env.parse_answer("sure: <reversed_text>\ncba\n</reversed_text>") == "cba"
    assert env.parse_answer("<reversed_text>cba") == "cba"  # cut off before the closing tag
    assert env.parse_answer("") is None


def test_the_same_seed_gives_the_same_prompts_and_another_seed_others():
    first = get_environment("reverse_text").sample_prompts(20, seed=7)
    again = get_environment("reverse_text").sample_prompts(20, seed=7)
    other = get_environment("reverse_text").sample_prompts(20, seed=8)
    assert first == again
    assert [p.question for p in first] != [p.question for p in other]


def test_the_eval_split_is_a_different_stream_from_train(env):
    train = [p.question for p in env.sample_prompts(20, split="train")]
    held_out = [p.question for p in env.sample_prompts(20, split="eval")]
    assert train != held_out


def test_the_prompt_stream_resumes_from_a_data_position(env):
    """A consumer that checkpoints its position (an int) and resumes gets exactly the prompts
    it would have had without stopping."""
    uninterrupted = env.sample_prompts(10, seed=3)
    before_stop = env.sample_prompts(4, seed=3)
    after_resume = env.dataset(seed=3).take(start=4, count=6)
    assert before_stop + after_resume == uninterrupted
    stream = env.dataset(seed=3).iter_from(4)
    assert [next(stream) for _ in range(6)] == after_resume
    assert [p.index for p in uninterrupted] == list(range(10))


def test_prompts_are_identical_in_another_python_process(env):
    """Prompt i must not depend on hash randomisation or process state: an orchestrator that
    restarts resumes the same data."""
    script = (
        "import json; from workbench.envs import get_environment; "
        "env = get_environment('reverse_text', min_length=6, max_length=12); "
        "print(json.dumps([p.question for p in env.sample_prompts(5, seed=11, start=100)]))"
    )
    output = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    ).stdout
    assert json.loads(output) == [p.question for p in env.sample_prompts(5, seed=11, start=100)]


def test_text_lengths_and_alphabet_follow_env_args():
    env = get_environment("reverse_text", min_length=9, max_length=14, alphabet="ab")
    questions = [p.question for p in env.sample_prompts(200)]
    assert {len(q) for q in questions} == set(range(9, 15))
    assert set("".join(questions)) == {"a", "b"}


def test_whitespace_never_starts_or_ends_a_text():
    env = get_environment("reverse_text", min_length=1, max_length=6, alphabet="a ")
    for prompt in env.sample_prompts(200):
        assert prompt.question == prompt.question.strip()


def test_no_system_prompt_by_default_and_one_on_request(env):
    assert env.prompt(0).messages == [{"role": "user", "content": env.prompt(0).question}]
    instructed = get_environment("reverse_text", system_prompt="reverse the text.")
    assert instructed.prompt(0).messages[0] == {"role": "system", "content": "reverse the text."}


def test_a_prompt_round_trips_through_json(env):
    prompt = env.prompt(5, seed=2, split="eval")
    assert Prompt.from_json(json.loads(json.dumps(prompt.to_json()))) == prompt
    assert env.reward(Prompt.from_json(prompt.to_json()), prompt.answer) == 1.0
