"""`dataset`: the rows of a local data file (JSON Lines, CSV or Parquet), with a reward of your choice.

    env = "dataset"
    env_args = { path = "data/reverse_words.jsonl", prompt_column = "text",
                 answer_column = "reversed", reward = "exact" }

Each row is one task: its prompt (a text column, a chat `messages` column, or a template
over columns), its reference answer, and optionally a system prompt for every row. The
reward is a comparison of the answer pulled out of the completion (`extract`) with the
row's reference (`reward`; see `workbench.envs.answers`).

Order and resume: prompt `i` of a `(seed, split)` stream is row `order[i % n]`, where
`order` is a permutation of the split's n rows seeded by (seed, split, i // n): every pass
over the data is shuffled anew, and the prompt at a data position is a pure function of it,
so a resumed run replays exactly the rows that would have come next.

The eval split comes from, in this order of preference: a second file (`eval_path`), a
column (`split_column` equal to `eval_value`), or a seeded held-out fraction
(`eval_fraction`, by a hash of each row's prompt, so duplicates of one prompt always fall on
the same side and a row keeps its side when rows are added to the file). Train and eval are
disjoint in every case but the second file's, which the user chose.

The file is read and every row checked when the environment is built, which preflight does
before anything starts: an error names the file, the line and the `env_args` key.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from workbench.envs import splits
from workbench.envs.answers import (
    Comparison,
    Extraction,
    compare,
    extract_answer,
    math_verify_missing,
    parse_number,
)
from workbench.envs.base import EnvArgs, Environment, EnvironmentConfigError, Message, Prompt, Task
from workbench.envs.data_files import Row, read_rows

DEFAULT_PROMPT_COLUMN = "prompt"
ROLES = ("system", "user", "assistant")


class DatasetArgs(EnvArgs):
    path: str = Field(
        description="the data file (.jsonl, .csv or .parquet); relative to the recipe's folder"
    )
    prompt_column: str | None = Field(
        None,
        description="the column holding the prompt: a text, or a chat list of {role, content} "
        f"messages (default {DEFAULT_PROMPT_COLUMN!r} unless prompt_template is given)",
    )
    prompt_template: str | None = Field(
        None,
        description="the prompt as a template over columns, e.g. 'Reverse: {text}' "
        "(Python format syntax; instead of prompt_column)",
    )
    answer_column: str = Field("answer", description="the column holding the reference answer")
    eval_path: str | None = Field(
        None, description="a second data file to evaluate on (same columns); relative as path"
    )
    split_column: str | None = Field(
        None, description="a column naming each row's split; rows equal to eval_value are eval"
    )
    eval_value: str = Field("test", description="the split_column value of eval rows")
    eval_fraction: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="without eval_path or split_column: the share of prompts held out for eval",
    )
    split_seed: int = Field(0, description="seeds which prompts eval_fraction holds out")
    extract: Extraction = Field(
        Extraction.NONE,
        description="how the answer is pulled out of a completion: none (all of it), boxed "
        "(last \\boxed{}), tag (inside the last pair of `tag` tags), last_number, regex (extract_pattern)",
    )
    tag: str = Field("answer", min_length=1, description="the tag extract = 'tag' reads")
    extract_pattern: str | None = Field(
        None,
        description="extract = 'regex': a pattern; its first group (or whole match) is the answer",
    )
    reward: Comparison = Field(
        Comparison.EXACT,
        description="how the answer is scored against the reference: exact, contains, regex "
        "(the reference is a pattern), numeric (within tolerance), math (math-verify), "
        "similarity (graded, difflib)",
    )
    ignore_case: bool = Field(False, description="compare answers case-insensitively")
    tolerance: float = Field(
        1e-6, ge=0, allow_inf_nan=False, description="reward = 'numeric': relative and absolute"
    )

    @field_validator("prompt_template")
    @classmethod
    def _template_names_columns(cls, template: str | None) -> str | None:
        if template is not None:
            fields = template_fields(template)
            if not fields:
                raise ValueError("prompt_template names no column; e.g. 'Reverse: {text}'")
        return template

    @field_validator("extract_pattern")
    @classmethod
    def _pattern_compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"extract_pattern is not a regular expression ({err})") from None
        return pattern

    @model_validator(mode="after")
    def _consistent(self) -> DatasetArgs:
        if self.prompt_column is not None and self.prompt_template is not None:
            raise ValueError("give prompt_column or prompt_template, not both")
        if self.extract is Extraction.REGEX and self.extract_pattern is None:
            raise ValueError("extract = 'regex' needs extract_pattern")
        if self.eval_path is not None and self.split_column is not None:
            raise ValueError("give eval_path or split_column, not both")
        if self.reward is Comparison.MATH and (missing := math_verify_missing()):
            raise ValueError(missing)
        return self


class DatasetEnvironment(Environment):
    """Tasks are the rows of a data file; the reward compares the extracted answer with the
    row's reference."""

    name = "dataset"
    Args = DatasetArgs
    args: DatasetArgs
    path_args = ("path", "eval_path")  # relative to the recipe's folder when it is read

    def __init__(self, args: DatasetArgs | None = None) -> None:
        super().__init__(args)
        self._pattern = re.compile(self.args.extract_pattern) if self.args.extract_pattern else None
        self._splits = self._read_splits()

    # ------------------------------------------------------------ the rows

    def _read_splits(self) -> dict[str, list[Task]]:
        args = self.args
        tasks = [self._task(row) for row in read_rows(Path(args.path))]
        if args.eval_path is not None:
            held_out = [self._task(row) for row in read_rows(Path(args.eval_path))]
            return {splits.TRAIN: tasks, splits.EVAL: held_out}
        if args.split_column is not None:
            eval_rows = [t for t in tasks if t.info["split"] == args.eval_value]
            return {
                splits.TRAIN: [t for t in tasks if t.info["split"] != args.eval_value],
                splits.EVAL: eval_rows,
            }
        return {
            split: [t for t in tasks if self._held_out(t) == (split == splits.EVAL)]
            for split in splits.SPLITS
        }

    def _task(self, row: Row) -> Task:
        args = self.args
        answer = _column(row, args.answer_column, "answer_column")
        if isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise EnvironmentConfigError(
                f"{row.where}: column {args.answer_column!r} (env_args.answer_column) must "
                f"hold a text or a number, not {type(answer).__name__}"
            )
        answer = str(answer)
        self._check_reference(row, answer)
        chat = None
        if args.prompt_template is not None:
            question = _render(row, args.prompt_template)
        else:
            column = args.prompt_column or DEFAULT_PROMPT_COLUMN
            value = _column(row, column, "prompt_column")
            if isinstance(value, list):
                chat = _chat(row, column, value)
                question = next(m["content"] for m in reversed(chat) if m["role"] == "user")
            elif isinstance(value, str):
                question = value
            else:
                raise EnvironmentConfigError(
                    f"{row.where}: column {column!r} (env_args.prompt_column) must hold a text "
                    f"or a list of chat messages, not {type(value).__name__}"
                )
        info = {"where": row.where}
        if args.split_column is not None:
            info["split"] = str(_column(row, args.split_column, "split_column"))
        return Task(question=question, answer=answer, info=info, chat=chat)

    def _check_reference(self, row: Row, answer: str) -> None:
        """A reference the reward could never match is an error in the file, found now."""
        key = f"column {self.args.answer_column!r} (env_args.answer_column)"
        if self.args.reward is Comparison.NUMERIC and parse_number(answer) is None:
            raise EnvironmentConfigError(
                f"{row.where}: {key} is {answer!r}, not a number, and reward = 'numeric'"
            )
        if self.args.reward is Comparison.REGEX:
            try:
                re.compile(answer)
            except re.error as err:
                raise EnvironmentConfigError(
                    f"{row.where}: {key} is not a regular expression ({err}), and reward = 'regex'"
                ) from None

    def task_key(self, task: Task) -> str:
        return json.dumps(task.chat) if task.chat else task.question

    def _held_out(self, task: Task) -> bool:
        key = f"{self.args.split_seed}|{self.task_key(task)}"
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "big") < self.args.eval_fraction * 2**64

    @cached_property
    def split_sizes(self) -> dict[str, int]:
        return {split: len(tasks) for split, tasks in self._splits.items()}

    # ------------------------------------------------------------ the stream

    def task_at(self, index: int, *, seed: int, split: str) -> Task:
        tasks = self._splits[split]
        if not tasks:
            raise EnvironmentConfigError(self._empty_split(split))
        epoch, offset = divmod(index, len(tasks))
        return tasks[shuffled_order(len(tasks), f"dataset|{split}|{seed}|{epoch}")[offset]]

    def _empty_split(self, split: str) -> str:
        args = self.args
        if split == splits.TRAIN:
            return f"{args.path}: every row is an eval row; nothing is left to train on"
        if args.eval_path is not None:
            return f"{args.eval_path} (env_args.eval_path): no rows"
        if args.split_column is not None:
            return (
                f"{args.path}: no row has {args.split_column} = {args.eval_value!r} "
                "(env_args.split_column, env_args.eval_value)"
            )
        return (
            f"{args.path}: env_args.eval_fraction = {args.eval_fraction} holds out no prompt of "
            f"its {self.split_sizes[splits.TRAIN]} rows; raise it, or give eval_path"
        )

    # ------------------------------------------------------------ the reward

    def parse_answer(self, completion: str) -> str | None:
        return extract_answer(
            completion, self.args.extract, tag=self.args.tag, pattern=self._pattern
        )

    def score(self, parsed_answer: str | None, prompt: Prompt) -> float:
        return compare(
            parsed_answer,
            prompt.answer,
            self.args.reward,
            ignore_case=self.args.ignore_case,
            tolerance=self.args.tolerance,
        )


@lru_cache(maxsize=8)
def shuffled_order(count: int, stream: str) -> tuple[int, ...]:
    # A string seed is hashed with SHA-512 by `random.Random`: the same order in any process.
    order = list(range(count))
    random.Random(stream).shuffle(order)
    return tuple(order)


def _column(row: Row, column: str, key: str) -> Any:
    if column not in row.values:
        columns = ", ".join(map(str, row.values)) or "none"
        raise EnvironmentConfigError(
            f"{row.where}: no column {column!r} (env_args.{key}); its columns: {columns}"
        )
    return row.values[column]


def template_fields(template: str) -> list[str]:
    """The column names a prompt template uses; ValueError if it is not a plain template."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(
            f"prompt_template is not a template ({err}); double a literal brace: {{{{ }}}}"
        ) from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(
                f"prompt_template: {{{name}}} is not a plain column field; use {{column}}"
            )
        names.append(name)
    return names


def _render(row: Row, template: str) -> str:
    for name in template_fields(template):
        _column(row, name, "prompt_template")
    return template.format_map({key: str(value) for key, value in row.values.items()})


def _chat(row: Row, column: str, value: list[Any]) -> list[Message]:
    chat = []
    for position, message in enumerate(value):
        if not (
            isinstance(message, dict)
            and message.get("role") in ROLES
            and isinstance(message.get("content"), str)
        ):
            raise EnvironmentConfigError(
                f"{row.where}: column {column!r} (env_args.prompt_column) message {position} "
                f"must be {{role, content}} with role one of {', '.join(ROLES)}"
            )
        chat.append({"role": message["role"], "content": message["content"]})
    if not any(m["role"] == "user" for m in chat):
        raise EnvironmentConfigError(
            f"{row.where}: column {column!r} (env_args.prompt_column) has no user message"
        )
    return chat
