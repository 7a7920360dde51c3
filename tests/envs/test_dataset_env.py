"""The `dataset` environment: a local data file as tasks, its splits, its order, its rewards,
and the errors that name the file, the line and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workbench.envs import EnvironmentConfigError, get_environment
from workbench.envs.answers import Comparison, Extraction, compare, extract_answer
from workbench.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "recipes" / "data" / "reverse_words.jsonl"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def numbered_rows(count: int) -> list[dict]:
    return [{"question": f"what is {i} + 1?", "answer": str(i + 1)} for i in range(count)]


def dataset(path: Path, **env_args):
    return get_environment("dataset", path=str(path), **env_args)


# ---------------------------------------------------------------- formats and prompts


def test_jsonl_csv_and_parquet_files_give_the_same_tasks(tmp_path: Path):
    rows = numbered_rows(40)
    jsonl = write_jsonl(tmp_path / "d.jsonl", rows)
    csv = tmp_path / "d.csv"
    csv.write_text(
        "question,answer\n" + "".join(f'"{r["question"]}",{r["answer"]}\n' for r in rows)
    )
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)

    envs = [dataset(p, prompt_column="question") for p in (jsonl, csv, parquet)]
    streams = [[(p.question, p.answer) for p in env.sample_prompts(60, seed=3)] for env in envs]
    assert streams[0] == streams[1] == streams[2]


def test_a_template_over_columns_and_a_system_prompt_make_the_chat(tmp_path: Path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"a": 2, "b": 3, "sum": 5}] * 3)
    env = dataset(
        path,
        prompt_template="Add {a} and {b}.",
        answer_column="sum",
        system_prompt="Answer with a number.",
        eval_path=str(path),
    )
    prompt = env.prompt(0)
    assert prompt.messages == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "Add 2 and 3."},
    ]
    assert prompt.answer == "5"


def test_a_messages_column_is_sent_as_the_conversation(tmp_path: Path):
    chat = [
        {"role": "system", "content": "You reverse text."},
        {"role": "user", "content": "abc"},
        {"role": "assistant", "content": "cba"},
        {"role": "user", "content": "hello"},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": chat, "answer": "olleh"}])
    env = dataset(path, prompt_column="messages", eval_path=str(path), system_prompt="ignored")
    prompt = env.prompt(0)
    assert prompt.messages == chat  # its own system message stays, no second one
    assert prompt.question == "hello"


# ---------------------------------------------------------------- order, resume and splits


def test_a_data_position_gives_the_same_prompt_in_any_process_and_each_pass_is_reshuffled(
    tmp_path: Path,
):
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(50))
    first, again = dataset(path, prompt_column="question"), dataset(path, prompt_column="question")
    size = first.split_sizes["train"]
    stream = [p.question for p in first.sample_prompts(3 * size, seed=7)]
    resumed = [p.question for p in again.sample_prompts(size, seed=7, start=size)]
    assert resumed == stream[size : 2 * size]
    # every pass covers every training row once, in a new order
    passes = [stream[i * size : (i + 1) * size] for i in range(3)]
    assert all(sorted(p) == sorted(passes[0]) for p in passes)
    assert passes[0] != passes[1]
    assert stream != [p.question for p in first.sample_prompts(3 * size, seed=8)]


def test_the_held_out_fraction_never_shares_a_prompt_with_training_even_when_rows_repeat(
    tmp_path: Path,
):
    rows = numbered_rows(300)
    path = write_jsonl(tmp_path / "d.jsonl", rows + rows[:100])  # 100 prompts twice
    env = dataset(path, prompt_column="question", eval_fraction=0.2, split_seed=1)
    train = {p.question for p in env.sample_prompts(2000)}
    held_out = {p.question for p in env.sample_prompts(500, split="eval")}
    assert train and held_out and not train & held_out
    assert len(train) + len(held_out) == 300
    assert 0.1 < len(held_out) / 300 < 0.3


def test_a_split_column_or_a_second_file_names_the_eval_rows(tmp_path: Path):
    rows = [
        {**row, "split": "test" if i % 4 == 0 else "train"}
        for i, row in enumerate(numbered_rows(40))
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    env = dataset(path, prompt_column="question", split_column="split")
    eval_questions = {p.question for p in env.sample_prompts(30, split="eval")}
    assert eval_questions == {r["question"] for r in rows if r["split"] == "test"}

    eval_file = write_jsonl(tmp_path / "e.jsonl", [{"question": "held out?", "answer": "yes"}])
    env = dataset(path, prompt_column="question", eval_path=str(eval_file))
    assert env.prompt(5, split="eval").question == "held out?"
    assert env.split_sizes["train"] == 40


# ---------------------------------------------------------------- rewards


@pytest.mark.parametrize(
    ("completion", "how", "tag", "expected"),
    [
        ("so the answer is \\boxed{\\frac{1}{2}} done", Extraction.BOXED, "", "\\frac{1}{2}"),
        ("<think>maybe 3</think><answer> 4 </answer>", Extraction.TAG, "answer", "4"),
        ("first 12, then 1,024.", Extraction.LAST_NUMBER, "", "1,024."),
        ("<think>x</think>  plain  ", Extraction.NONE, "", "plain"),
        ("\\boxed{cut off", Extraction.BOXED, "", None),
    ],
)
def test_answers_are_extracted(completion: str, how: Extraction, tag: str, expected):
    assert extract_answer(completion, how, tag=tag or "answer") == expected


@pytest.mark.parametrize(
    ("answer", "reference", "how", "reward"),
    [
        ("olleh", "olleh", Comparison.EXACT, 1.0),
        ("Olleh", "olleh", Comparison.EXACT, 0.0),
        ("it is 42 I think", "42", Comparison.CONTAINS, 1.0),
        ("2024-01-05", r"\d{4}-\d{2}-\d{2}", Comparison.REGEX, 1.0),
        ("1,024.", "1024", Comparison.NUMERIC, 1.0),
        ("3.14", "3.15", Comparison.NUMERIC, 0.0),
        ("0.5", "\\frac{1}{2}", Comparison.MATH, 1.0),
        ("\\frac{2}{4}", "1/2", Comparison.MATH, 1.0),
        ("0.6", "1/2", Comparison.MATH, 0.0),
        (None, "x", Comparison.EXACT, 0.0),
    ],
)
def test_comparisons_score_answers(answer, reference, how: Comparison, reward: float):
    assert compare(answer, reference, how) == reward


def test_a_boxed_math_answer_scores_against_its_row(tmp_path: Path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "half of one?", "answer": "1/2"}])
    env = dataset(path, extract="boxed", reward="math", eval_path=str(path))
    prompt = env.prompt(0)
    assert env.reward(prompt, "<think>hmm</think> It is \\boxed{0.5}.") == 1.0
    assert env.reward(prompt, "It is 0.5.") == 0.0  # no box, no answer


# ---------------------------------------------------------------- errors name file, line, key


def test_a_missing_column_names_the_line_the_key_and_the_columns(tmp_path: Path):
    rows = numbered_rows(3)
    rows[1] = {"question": "q"}
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(EnvironmentConfigError) as err:
        dataset(path, prompt_column="question")
    assert f"{path}:2" in str(err.value)
    assert "'answer' (env_args.answer_column)" in str(err.value)
    assert "its columns: question" in str(err.value)


@pytest.mark.parametrize(
    ("content", "env_args", "expected"),
    [
        ('{"prompt": "a", "answer": "1"}\nnot json\n', {}, ":2: not valid JSON"),
        ('{"prompt": "a", "answer": "one"}\n', {"reward": "numeric"}, "not a number"),
        ('{"prompt": "a", "answer": "(["}\n', {"reward": "regex"}, "not a regular expression"),
        ('{"prompt": 3, "answer": "1"}\n', {}, "env_args.prompt_column) must hold a text"),
        (
            '{"messages": [{"role": "bot", "content": "x"}], "answer": "1"}\n',
            {"prompt_column": "messages"},
            "message 0 must be {role, content}",
        ),
        ('{"a": "x", "answer": "1"}\n', {"prompt_template": "Q: {b}"}, "no column 'b'"),
    ],
)
def test_bad_rows_are_refused_with_where_and_why(tmp_path: Path, content, env_args, expected):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(EnvironmentConfigError, match=r"d\.jsonl") as err:
        dataset(path, **env_args)
    assert expected in str(err.value)


@pytest.mark.parametrize(
    ("env_args", "expected"),
    [
        ({"prompt_column": "a", "prompt_template": "{a}"}, "not both"),
        ({"extract": "regex"}, "needs extract_pattern"),
        ({"extract_pattern": "(["}, "not a regular expression"),
        ({"prompt_template": "no fields"}, "names no column"),
        ({"prompt_template": "{a!r}"}, "not a plain column field"),
        ({"tolerance": float("inf")}, "tolerance"),
        ({"reward": "close"}, "reward"),
    ],
)
def test_bad_env_args_are_refused_before_the_file_is_read(tmp_path: Path, env_args, expected):
    with pytest.raises(EnvironmentConfigError) as err:
        dataset(tmp_path / "never_read.jsonl", **env_args)
    assert expected in str(err.value)


def test_a_missing_file_or_an_unknown_type_is_named(tmp_path: Path):
    with pytest.raises(EnvironmentConfigError, match="no such data file"):
        dataset(tmp_path / "absent.jsonl")
    (tmp_path / "d.xlsx").write_text("x")
    with pytest.raises(EnvironmentConfigError, match=r"unknown data file type '\.xlsx'"):
        dataset(tmp_path / "d.xlsx")


def test_an_eval_fraction_too_small_for_the_file_says_so_when_eval_is_asked(tmp_path: Path):
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(3))
    env = dataset(path, prompt_column="question", eval_fraction=0.001)
    with pytest.raises(EnvironmentConfigError, match="holds out no prompt of its 3 rows"):
        env.prompt(0, split="eval")


# ---------------------------------------------------------------- the shipped file


def test_the_shipped_reversal_file_scores_its_own_answers_fully():
    env = dataset(SHIPPED, prompt_column="text", answer_column="reversed")
    assert env.split_sizes["train"] + env.split_sizes["eval"] == 1200
    for prompt in env.sample_prompts(20) + env.sample_prompts(5, split="eval"):
        assert prompt.answer == prompt.question[::-1]
        assert env.reward(prompt, prompt.answer) == 1.0
        assert env.reward(prompt, prompt.question) < 1.0 or prompt.question == prompt.answer


# ---------------------------------------------------------------- in a recipe


def test_a_recipes_data_path_is_read_from_the_recipes_folder_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    write_jsonl(folder / "data" / "train.jsonl", numbered_rows(40))
    recipe = folder / "recipe.toml"
    recipe.write_text(
        '[model]\nbase = "builtin:tiny-reverse"\n\n[defaults]\nenv = "dataset"\n'
        'env_args = { path = "data/train.jsonl", prompt_column = "question" }\n\n'
        '[[runs]]\nid = "a"\n\n[[runs]]\nid = "b"\nenv_args = { path = "data/train.jsonl", '
        'prompt_column = "question", reward = "numeric" }\n'
    )
    monkeypatch.chdir(tmp_path)  # not the recipe's folder
    configs = load_recipe(recipe).run_configs()
    expected = str((folder / "data" / "train.jsonl").resolve())
    assert [c.env_args["path"] for c in configs.values()] == [expected, expected]
    env = get_environment(configs["run_b"].env, **configs["run_b"].env_args)
    assert env.reward(env.prompt(0), env.prompt(0).answer + ".0") == 1.0
