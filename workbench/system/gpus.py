"""How many NVIDIA GPUs this machine has: the one place that asks.

Read from the driver's `/proc` entries, so asking initialises no CUDA context (the supervisor
and the inference server ask before any process has chosen its devices).
"""

from __future__ import annotations

import os

NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def detect_gpu_count() -> int:
    """NVIDIA GPUs the driver exposes (0 without a driver); no CUDA initialisation."""
    try:
        return len(os.listdir(NVIDIA_GPUS))
    except OSError:
        return 0
