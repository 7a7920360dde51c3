"""The venv that verifiers environments run in: made by `workbench env install verifiers`.

verifiers 0.4 pins openai below 3 and mcp 2.0; vLLM's CPU build needs openai 3.57. The two
cannot share workbench's venv, so verifiers gets one of its own under the workbench cache
(`$WORKBENCH_CACHE_DIR/envs/verifiers`, or `$WORKBENCH_VERIFIERS_VENV`), and each
`verifiers:` environment runs in a process started from it (`verifiers_server.py`).

The venv holds verifiers and pydantic at the releases the server was written and tested
against (`verifiers_versions.py`; the rest at `constraints/verifiers.txt`'s versions, as
`scripts/install.sh` installs workbench's own venv), uv (verifiers' own
harnesses, `null` among them, run each episode's program as a uv script; workbench's
default, `workbench-chat`, runs the same loop in the server's process) and the
environments' own packages (`--with`). Installing ends by preparing the `null` harness's
program once, so its packages are in uv's cache before an episode asks for it. `workbench.json` in the venv is written last: a venv
without it is an install that did not finish.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from workbench.envs.verifiers_versions import INSTALL_COMMAND, TESTED
from workbench.system.cache import cache_dir

VENV_ENV = "WORKBENCH_VERIFIERS_VENV"
MARKER = "workbench.json"
SERVER_SCRIPT = Path(__file__).with_name("verifiers_server.py")
# Written by scripts/freeze_constraints.sh from the venv the verifiers tests passed with.
CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints" / "verifiers.txt"
# As for scripts/install.sh: 1 installs the newest versions allowed (to refresh them).
NO_CONSTRAINTS_ENV = "WORKBENCH_NO_CONSTRAINTS"


class InstallError(RuntimeError):
    """Making the venv failed; the message says at which step and why."""


def venv_dir() -> Path:
    override = os.environ.get(VENV_ENV)
    return Path(override).expanduser() if override else cache_dir() / "envs" / "verifiers"


def venv_python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def installed(venv: Path | None = None) -> dict | None:
    """What the finished install recorded (`{"verifiers": ..., "with": [...]}`), or None."""
    try:
        return json.loads(((venv or venv_dir()) / MARKER).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def missing_problem(venv: Path | None = None) -> str | None:
    """Why `verifiers:` environments cannot run here (with the command that fixes it), or
    None."""
    venv = venv or venv_dir()
    if installed(venv) is not None and venv_python(venv).exists():
        return None
    state = "did not finish installing" if venv.exists() else "is not installed"
    return (
        f"verifiers environments run in a venv of their own, and {venv} {state}: make it with "
        f"`{INSTALL_COMMAND}` (add `--with PACKAGE` for each environment package)"
    )


def server_environment(venv: Path | None = None, path: str | None = None) -> dict[str, str]:
    """The process environment of an environment server: the venv's tools first on PATH
    (verifiers calls uv), its python's own packages only (`path` added for a local module)."""
    venv = venv or venv_dir()
    env = dict(os.environ)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    if path:
        env["PYTHONPATH"] = path
    return env


def install(
    *,
    python: str | None = None,
    requirements: Sequence[str] = (),
    venv: Path | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    """Make (or add `requirements` to) the verifiers venv; returns its directory.

    `python` is the interpreter to make it from (3.11 or newer; default the one running
    workbench). Raises `InstallError` naming the step that failed."""
    venv = venv or venv_dir()
    before = installed(venv) or {}
    wanted = list(dict.fromkeys([*before.get("with", []), *requirements]))
    if not venv_python(venv).exists():
        say(f"making a venv in {venv}")
        venv.parent.mkdir(parents=True, exist_ok=True)
        _step("make the venv", [python or sys.executable, "-m", "venv", str(venv)])
    # Unmark first: a venv whose install fails half-way is not taken for a finished one.
    (venv / MARKER).unlink(missing_ok=True)
    packages = pip_install_arguments(wanted)
    say(f"installing {' '.join(packages)}")
    _step("install the packages", [str(venv_python(venv)), "-m", "pip", "install", *packages])
    say("preparing the harness program every episode runs (a uv script)")
    _step(
        "prepare the harness program",
        [str(venv_python(venv)), str(SERVER_SCRIPT), "--warm"],
        env=server_environment(venv),
    )
    marker = {
        **installed_versions(venv),
        "with": wanted,
        "python": python or sys.executable,
    }
    (venv / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return venv


def pip_install_arguments(requirements: Sequence[str] = ()) -> list[str]:
    """What `pip install` is given: verifiers at its tested release, uv and `requirements`;
    unless WORKBENCH_NO_CONSTRAINTS=1, pydantic at its tested release too and every other
    package at constraints/verifiers.txt's version (where the checkout has the file)."""
    pins = [f"verifiers=={TESTED['verifiers']}"]
    constraints: list[str] = []
    if os.environ.get(NO_CONSTRAINTS_ENV) != "1":
        pins.append(f"pydantic=={TESTED['pydantic']}")
        if CONSTRAINTS.is_file():
            constraints = ["--constraint", str(CONSTRAINTS)]
        # A requirement of an environment's package that disagrees fails pip's install,
        # naming both: the environment is then not one these releases were tested with.
    return [*constraints, *pins, "uv", *requirements]


def installed_versions(venv: Path | None = None) -> dict[str, str]:
    """The releases of `TESTED`'s packages installed in the venv (read by its python)."""
    script = (
        "import json\nfrom importlib import metadata\n"
        f"print(json.dumps({{name: metadata.version(name) for name in {sorted(TESTED)!r}}}))"
    )
    result = subprocess.run(
        [str(venv_python(venv)), "-c", script], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise InstallError(f"could not read the installed versions:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def _step(what: str, command: list[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip())[-3000:]
        raise InstallError(f"could not {what} ({' '.join(command)}):\n{output}")
