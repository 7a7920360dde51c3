"""Importing the user's own code a recipe names as `package.module:function` (a loss) or
`package.module:Class` (an environment), from where the docs say it is found.

That is the directory `workbench` runs in, then PYTHONPATH and the installed packages: what
`python -m` gives. The processes workbench starts are started with `python -m` in that
same directory (the supervisor, each orchestrator, the trainer under torchrun), but the
installed `workbench` command is not: its path starts with the venv's bin directory, so a
module beside the user would be found by the trainer and not by the check `workbench up`
makes before anything starts. Every import of the user's code goes through
`import_user_module`, so each process looks in the same places whichever way it started.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

WHERE_USER_CODE_IS_FOUND = (
    "a module of yours is imported from the directory workbench runs in ({cwd}), from "
    "PYTHONPATH or from the installed packages"
)


def import_user_module(name: str) -> ModuleType:
    """`importlib.import_module(name)` with the current directory first on the path, as
    `python -m` has it."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def not_found_hint() -> str:
    """Where a module that did not import was looked for, for the error that names it."""
    return WHERE_USER_CODE_IS_FOUND.format(cwd=os.getcwd())
