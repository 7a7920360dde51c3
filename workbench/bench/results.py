"""Writing benchmark results: one JSON file per benchmark run, with the machine it ran on."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from workbench.files import layout
from workbench.system.procfs import processor_name

RESULTS_DIR = Path("benchmarks/results")
# The checkout a result measures: where workbench is imported from.
CHECKOUT = Path(__file__).resolve().parents[2]
# Paths whose edits do not change what a benchmark measures: the results it writes (the
# `-latest` files are tracked) and the docs that quote them.
NOT_MEASURED = ("benchmarks/results", "docs")


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
    }
    if cpu := processor_name():
        info["cpu"] = cpu
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def code(checkout: Path = CHECKOUT) -> dict[str, Any]:
    """Which workbench a result measured: its version and, in a git checkout, the commit and
    the files that differed from it, new ones included (a local edit measured, named so).
    Figures from one sitting compare only when this says the same code, or names the edit
    between them."""
    info: dict[str, Any] = {"version": _version()}
    commit = _git(checkout, "rev-parse", "HEAD")
    if commit is None:
        return info
    status = _git(
        checkout, "status", "--porcelain", "--untracked-files=normal", "--", ".",
        *(f":(exclude){path}" for path in NOT_MEASURED),
    )  # fmt: skip
    changed = sorted(line[3:] for line in (status or "").splitlines() if line.strip())
    return {**info, "commit": commit.strip(), "edited": changed}


def _version() -> str | None:
    try:
        return metadata.version("workbench")
    except metadata.PackageNotFoundError:
        return None


def _git(checkout: Path, *args: str) -> str | None:
    """git's output in `checkout`, or None where it is not a git checkout (an installed
    wheel) or git is missing."""
    try:
        done = subprocess.run(
            ["git", "-C", str(checkout), *args],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def write_result(name: str, payload: dict[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Write `benchmarks/results/<name>-<timestamp>.json` and `<name>-latest.json`."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    document = {
        "benchmark": name,
        "created": stamp,
        "machine": machine(),
        "code": code(),
        **_invocation(),
        **payload,
    }
    text = json.dumps(document, indent=2)
    path = results_dir / f"{name}-{stamp}.json"
    layout.atomic_write_text(path, text)
    layout.atomic_write_text(results_dir / f"{name}-latest.json", text)
    return path


def _invocation() -> dict[str, Any]:
    """The `workbench bench ...` command line that measured a result, so that the figures
    page can say how to measure it again; nothing when not run from the command line."""
    if sys.argv[1:2] != ["bench"]:
        return {}
    return {"invocation": ["workbench", *sys.argv[1:]]}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
