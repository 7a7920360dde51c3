"""The verifiers and pydantic releases that a verifiers environment's process was written and
tested against, and the check that the installed ones are them.

`verifiers_server.py` relies on verifiers' internals (how its interception server builds
model clients, its trace graph) and `verifiers_speedups.py` replaces functions of verifiers
and pydantic where those releases keep them; both change between releases. The venv pins
both (`verifiers_venv.py`, `constraints/verifiers.txt`); the process refuses another
verifiers, naming both versions, and the caches are put in place on the tested releases
only.

Imported by workbench (`workbench.envs.verifiers_versions`) and, as a module beside the
script, by the environment's process in the verifiers venv: the standard library only.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata

# Moving a pin: change it here, reinstall the venv without constraints
# (`WORKBENCH_NO_CONSTRAINTS=1 workbench env install verifiers`), run the verifiers tests,
# then `bash scripts/freeze_constraints.sh` (a test fails while these and the constraints
# disagree).
TESTED = {"verifiers": "0.4.0", "pydantic": "2.14.4"}
# Set to 1 to serve with another verifiers release anyway (when moving the pin).
ALLOW_UNTESTED_ENV = "WORKBENCH_ALLOW_UNTESTED_VERIFIERS"
INSTALL_COMMAND = "workbench env install verifiers"


def installed_version(distribution: str) -> str | None:
    """The installed release of `distribution`, from its metadata, or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def untested(distribution: str) -> str | None:
    """Why the installed `distribution` is not the tested release (the two versions), or
    None when it is. Not installed counts as untested."""
    version = installed_version(distribution)
    tested = TESTED[distribution]
    if version == tested:
        return None
    return f"{distribution} {version or '(none)'} is installed, not the tested {tested}"


def release_problem(distribution: str = "verifiers") -> str | None:
    """Why this process refuses to serve with the installed `distribution`, or None (also
    when ALLOW_UNTESTED_ENV=1)."""
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        return None
    version = installed_version(distribution)
    tested = TESTED[distribution]
    if version == tested:
        return None
    return (
        f"{distribution} {version or '(none)'} is installed in {sys.prefix}, but workbench's "
        f"verifiers environments were written and tested against {distribution} {tested}, "
        f"whose internals they use: reinstall the venv (`{INSTALL_COMMAND}`), or set "
        f"{ALLOW_UNTESTED_ENV}=1 to try {version} anyway"
    )
