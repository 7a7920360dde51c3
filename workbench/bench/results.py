"""Writing benchmark results: one JSON file per benchmark run, with the machine it ran on."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from workbench.files import layout

RESULTS_DIR = Path("benchmarks/results")


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_result(name: str, payload: dict[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Write `benchmarks/results/<name>-<timestamp>.json` and `<name>-latest.json`."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    document = {"benchmark": name, "created": stamp, "machine": machine(), **payload}
    text = json.dumps(document, indent=2)
    path = results_dir / f"{name}-{stamp}.json"
    layout.atomic_write_text(path, text)
    layout.atomic_write_text(results_dir / f"{name}-latest.json", text)
    return path


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
