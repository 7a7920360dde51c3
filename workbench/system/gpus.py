"""How many NVIDIA GPUs this machine has, and how much memory each: the one place that asks.

The count is read from the driver's `/proc` entries and the memory from `nvidia-smi`, so
asking initialises no CUDA context (the supervisor and the inference server ask before any
process has chosen its devices).
"""

from __future__ import annotations

import os
import subprocess

NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def detect_gpu_count() -> int:
    """NVIDIA GPUs the driver exposes (0 without a driver); no CUDA initialisation."""
    try:
        return len(os.listdir(NVIDIA_GPUS))
    except OSError:
        return 0


def gpu_memory_bytes() -> list[int] | None:
    """Each GPU's total memory in bytes, by index, from `nvidia-smi` (no CUDA
    initialisation); None when it cannot be asked."""
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if result.returncode != 0:
            return None
        return [int(float(line)) << 20 for line in result.stdout.split() if line.strip()]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
