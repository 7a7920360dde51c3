"""Every command the docs show runs: each `workbench ...` line of a code block names
commands and options the CLI has, and each script or test path it names exists.

The command reference (docs/reference/cli.md) is generated from the app and checked
elsewhere; the development history pages record what was run then, so neither is read.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from workbench.cli import app

REPO = Path(__file__).resolve().parents[2]
SHELL_OPERATORS = ("&&", "||", "|", ";", ">", "&")


def pages() -> list[Path]:
    docs = sorted((REPO / "docs").rglob("*.md"))
    return [REPO / "README.md"] + [
        page
        for page in docs
        if "history" not in page.relative_to(REPO).parts and page.name != "cli.md"
    ]


def shell_lines(text: str) -> list[str]:
    """The lines of the page's shell code blocks, continuations joined, prompts dropped."""
    lines, language, block = [], None, []
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\w*)", line)
        if fence and language is None:
            language, block = fence.group(1), []
        elif fence:
            if language in {"", "bash", "console", "sh", "shell"}:
                joined = "\n".join(block).replace("\\\n", " ")
                lines += [re.sub(r"^\$ ", "", entry.strip()) for entry in joined.splitlines()]
            language = None
        elif language is not None:
            block.append(line)
    return lines


def command_problem(line: str) -> str | None:
    """Why the CLI would refuse `line` for its shape (a command or an option it does not
    have), or None. Values and arguments are placeholders in the docs, so only the
    command path and the option names are checked."""
    args = shlex.split(line, comments=True)[1:]
    for operator in SHELL_OPERATORS:
        if operator in args:
            args = args[: args.index(operator)]
    command, name, parent = typer.main.get_command(app), "workbench", None
    while True:
        try:
            context = command.make_context(name, args, parent=parent)
        except Exception as err:  # typer vendors click, so its exceptions are typer's own
            kind = type(err).__name__
            if kind in {"NoSuchOption", "BadOptionUsage"} or "No such command" in str(err):
                return f"{kind}: {err}"
            return None  # a placeholder value, an argument left out, --help
        args = context._protected_args + context.args  # a group's sub-command and the rest
        if not hasattr(context.command, "resolve_command") or not args:
            return None
        try:
            name, command, args = context.command.resolve_command(context, args)
        except Exception as err:
            return f"{type(err).__name__}: {err}"
        parent = context


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_command_a_page_shows_runs(page: Path):
    problems = []
    for line in shell_lines(page.read_text(encoding="utf-8")):
        if line.startswith("workbench "):
            problem = command_problem(line)
            if problem:
                problems.append(f"{line!r}: {problem}")
        for path in re.findall(r"(?:python3?|bash|\.venv/bin/python) (scripts/\S+)", line):
            if not (REPO / path).exists():
                problems.append(f"{line!r}: {path} does not exist")
        for path in re.findall(r"pytest(?: -\S+)* ((?:tests/\S+ ?)+)", line):
            problems += [
                f"{line!r}: {p} does not exist"
                for p in path.split()
                if not (REPO / p.split("::")[0]).exists()
            ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "line, refused",
    [
        ("workbench up recipes/reverse_text.toml --headless", False),
        ("workbench runs fork run_a@3 run_b --set lr=1e-3", False),
        ("workbench up recipes/reverse_text.toml --no-such-option", True),
        ("workbench no-such-command", True),
        ("workbench runs no-such-command x", True),
    ],
)
def test_the_check_refuses_a_command_or_option_the_cli_lacks(line: str, refused: bool):
    assert (command_problem(line) is not None) is refused
