"""Running the `workbench` command as a user would, for the end-to-end tests.

One copy of what every e2e test needs: the command line, an environment in which the
test's own modules import (`package.module:name` environments and losses defined under
tests/), and, when a command runs past its time, the tail of every log it left, so that a
failure seen only in CI says which process stopped moving.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKBENCH = [sys.executable, "-m", "workbench.cli"]
LOG_LINES = 40


def environment(**extra: str) -> dict[str, str]:
    """This process's environment with the repository importable, and `extra` on top."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def workbench(
    *args: str, cwd: Path, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`workbench ARGS` in `cwd`; past `timeout` it is killed and the test fails with the
    command's output and the tail of every log under `cwd`."""
    try:
        return subprocess.run(
            [*WORKBENCH, *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env or environment(),
        )
    except subprocess.TimeoutExpired as err:
        output = _text(err.stdout)[-3000:] + _text(err.stderr)[-3000:]
        raise AssertionError(
            f"`workbench {' '.join(args)}` ran past {timeout:.0f} s\n{output}\n{log_tails(cwd)}"
        ) from None


def log_tails(directory: Path, lines: int = LOG_LINES) -> str:
    """The last `lines` lines of every *.log under `directory`, newest last."""
    logs = sorted(directory.rglob("*.log"), key=lambda path: path.stat().st_mtime)
    parts = []
    for log in logs:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(
            f"--- {log.relative_to(directory)} (last {len(tail)} lines)\n" + "\n".join(tail)
        )
    return "\n".join(parts) or f"(no logs under {directory})"


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""
