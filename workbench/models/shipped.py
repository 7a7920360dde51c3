"""Model weights shipped inside the package: recorded, verified and copied out bit for bit.

A model trained here from a seed is not the same model on every machine: its float results
depend on the processor's kernels (two AMD EPYC machines of the same kind built two
`builtin:tiny-reverse` models whose held-out reward on 9-letter texts was 0.61 and 0.70, and
only the first left reinforcement learning room to climb). So a built-in model is built once,
by `workbench model build --from-scratch`, and its files ship with the package; every machine
then serves the same bits. Its `build.json` records the sha256 of every other file and how
the files were made (command, torch and transformers versions, processor), which the copy
checks before it hands the model out.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
from pathlib import Path
from typing import Any

from workbench.system.procfs import processor_name

BUILD_INFO_FILE = "build.json"
# The folder of the package that holds one directory of weights per shipped builtin.
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
_CHUNK = 1 << 20


class ShippedWeightsError(ValueError):
    """Shipped files that do not match what their `build.json` records."""


def shipped_dir(name: str) -> Path:
    """Where the package keeps builtin `name`'s weights (it may not ship any)."""
    return WEIGHTS_DIR / name


def read_build_info(model_dir: Path) -> dict[str, Any] | None:
    path = Path(model_dir) / BUILD_INFO_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_digests(model_dir: Path) -> dict[str, str]:
    """sha256 of every file of `model_dir` but `build.json` (which records them)."""
    return {
        path.name: file_sha256(path)
        for path in sorted(Path(model_dir).iterdir())
        if path.is_file() and path.name != BUILD_INFO_FILE
    }


def machine_description() -> dict[str, str]:
    """What made a build's floats what they are: the libraries and the processor."""
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "processor": _processor_name(),
        "machine": platform.machine(),
    }


def _processor_name() -> str:
    return processor_name() or platform.processor() or "unknown"


def record_shipment(model_dir: Path, command: str) -> dict[str, Any]:
    """Add the file digests and how they were made to `model_dir`'s `build.json`."""
    info = read_build_info(model_dir) or {}
    info["sha256"] = file_digests(model_dir)
    info["made_with"] = {"command": command, **machine_description()}
    (Path(model_dir) / BUILD_INFO_FILE).write_text(
        json.dumps(info, indent=2) + "\n", encoding="utf-8"
    )
    return info


def verify(model_dir: Path) -> None:
    """Raise `ShippedWeightsError` unless every file `build.json` records is there with its
    recorded sha256, and no other file is."""
    info = read_build_info(model_dir)
    if info is None or "sha256" not in info:
        raise ShippedWeightsError(f"{model_dir} has no {BUILD_INFO_FILE} recording its files")
    found = file_digests(model_dir)
    recorded = info["sha256"]
    if found != recorded:
        differing = sorted(
            name for name in set(found) | set(recorded) if found.get(name) != recorded.get(name)
        )
        raise ShippedWeightsError(
            f"{model_dir}: {', '.join(differing)} differ from what {BUILD_INFO_FILE} records"
        )


def copy_verified(source: Path, target: Path) -> None:
    """Copy the shipped model `source` into the empty directory `target`, then check the
    copy against `source`'s record (a damaged install or a short copy is refused)."""
    for path in sorted(Path(source).iterdir()):
        if path.is_file():
            shutil.copyfile(path, Path(target) / path.name)
    verify(target)
