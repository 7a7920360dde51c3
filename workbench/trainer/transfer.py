"""Host-to-device copies of batch data: pinned and non-blocking where the device is a GPU.

A copy from ordinary (pageable) host memory makes the host wait while the driver stages it;
from pinned memory the copy is queued behind the work already on the stream and the host
goes on packing the next row. The caching host allocator keeps the pinned buffer until the
copy has run, so the source may be dropped at once.
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; a host tensor bound for CUDA goes through pinned memory."""
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
