"""How the trainer's ranks work together: device and process group, which rank is the master,
the master's packed rows sent out as one share per rank, and the sums over ranks.

Data parallelism is done by hand rather than with DDP: the base model is frozen (replicated
on every rank, or sharded over them by FSDP2, `sharding.py`) and the only gradients are the
adapters' (a few MB, whole on every rank either way), so each rank runs its share of the
packed micro-batches and the adapter gradients are summed with one all-reduce. Summing (not DDP's averaging) matters: each run's loss is already normalised
by its own token count over the whole step, so the sum over ranks is exactly the gradient
one rank would get from the whole batch. Works with gloo on CPU and nccl on CUDA.

Without a process group (one process, not started by torchrun) there is one rank, the
master, and every collective here is a no-op.
"""

from __future__ import annotations

import gc
import os
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def pick_device() -> tuple[torch.device, str]:
    """This rank's device and the collective backend that goes with it."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def init_process_group() -> torch.device:
    """Pick this rank's device and, under torchrun, join the process group; returns the device."""
    device, backend = pick_device()
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        dist.init_process_group(backend)
    return device


def barrier() -> None:
    """Wait until every rank is here."""
    if _grouped():
        dist.barrier()


def destroy_process_group() -> None:
    """Leave the process group, and free it now. Call it once the models are no longer
    referenced: FSDP2's modules hold the group in reference cycles (measured: three
    references that only the collector frees), which would otherwise free it during the
    interpreter's exit, where gloo's pending work dropping its tensors aborts the process
    (SIGABRT, "terminate called without an active exception"), now and then, after a
    clean stop."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
        gc.collect()


def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if _grouped() else 0


def world_size() -> int:
    return dist.get_world_size() if _grouped() else 1


def is_master() -> bool:
    """Rank 0: the rank that discovers runs, packs batches and writes every file."""
    return rank() == 0


def broadcast_from_master(value: T) -> T:
    """The master's `value` on every rank (pickled); other ranks' arguments are ignored."""
    if world_size() == 1:
        return value
    payload = [value]
    dist.broadcast_object_list(payload, src=0)
    return payload[0]


def all_reduce_sum(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`values` summed over ranks, returned where `values` lives (the collective runs on `device`)."""
    if world_size() == 1:
        return values
    totals = values.to(device)
    dist.all_reduce(totals)
    return totals.to(values.device)


def all_reduce_max(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`values`' element-wise maximum over ranks, returned where `values` lives."""
    if world_size() == 1:
        return values
    totals = values.to(device)
    dist.all_reduce(totals, op=dist.ReduceOp.MAX)
    return totals.to(values.device)


def all_reduce_grads(params: list[torch.nn.Parameter], device: torch.device) -> None:
    """Sum the gradients of `params` (every ready run's adapters) over ranks in one flat all-reduce.

    A rank whose rows held no tokens of a run has no gradient for it; it contributes zeros,
    so every rank reduces the same tensors in the same order.
    """
    if world_size() == 1 or not params:
        return
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    flat = torch.cat([param.grad.reshape(-1) for param in params]).to(device)
    dist.all_reduce(flat)
    offset = 0
    for param in params:
        n = param.numel()
        param.grad.copy_(flat[offset : offset + n].view_as(param.grad))
        offset += n
