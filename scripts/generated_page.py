"""The command line shared by the scripts that write a documentation page from the code
(`recipe_reference.py`, `cli_reference.py`): rewrite the page, or with `--check` only say
whether it is out of date (exit 1), as the tests and `just docs-reference` use them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def run(
    argv: list[str] | None,
    *,
    description: str,
    page: Path,
    wanted_from: Callable[[str], str],
    script: str,
) -> int:
    """`wanted_from(current text)` is what the page should say; `script` is how to rerun."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if stale")
    parser.add_argument("--page", type=Path, default=page)
    args = parser.parse_args(argv)
    current = args.page.read_text(encoding="utf-8") if args.page.exists() else ""
    wanted = wanted_from(current)
    if wanted == current:
        return 0
    if args.check:
        print(f"{args.page} is out of date; run `python {script}`", file=sys.stderr)
        return 1
    args.page.write_text(wanted, encoding="utf-8")
    print(f"{args.page}: rewritten")
    return 0
