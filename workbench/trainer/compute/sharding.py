"""How the frozen base lies over the trainer's ranks: a whole copy on each, or sharded by FSDP2.

Sharded (`[trainer] base_sharding`), every decoder layer is its own FSDP2 unit and the row
model (`compute.RowLogprobs`, the root) holds the rest: embeddings, final norm and LM head,
tied or not. Each rank keeps 1/ranks of every frozen weight and gathers a unit just before
it computes (forward, and again in backward for the input gradients the adapters below it
need), then frees it; the root's gathered weights stay for the whole row, since the LM
head's backward comes first.

Adapters stay whole on every rank (`ignored_params`): FSDP2 neither shards nor reduces them,
and `distributed.all_reduce_grads` sums their gradients as with a replicated base. So each
run's optimizer, clipping over its own norm, broadcasts and checkpoints see plain full
tensors, as on one rank. Sharding them too saves little and costs time: measured on 2 CPU
ranks (`scripts/adapter_sharding.py`, the cpu-vocab model, 4 runs of rank 8), adapter
bytes per rank 2.49 -> 1.25 MB beside 80 MB of sharded base, and forward plus backward of
an update 23.4 -> 25.4 s (gathering and reduce-scattering them with every layer), before
each run's norm, broadcast and checkpoint would gather its shards again. And FSDP2 gathers
a unit's parameters in one dtype, while adapters are float32 beside a bfloat16 base.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from workbench.trainer.compute.model import decoder_layers

logger = logging.getLogger(__name__)


def shard_base(
    row_model: nn.Module, model: nn.Module, device: torch.device, world_size: int
) -> None:
    """Shard `model`'s frozen weights over the ranks in place; `row_model` (which holds
    `model`) becomes the root unit. Call after the adapters, the attention path and activation
    checkpointing are in place, on every rank, in the same order."""
    mesh = init_device_mesh(device.type, (world_size,))
    adapters = {param for param in model.parameters() if param.requires_grad}
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, ignored_params=adapters)
    fully_shard(row_model, mesh=mesh, ignored_params=adapters)
    logger.info(
        "base sharded over %d ranks (FSDP2, one unit per decoder layer): %.1f of %.1f MB "
        "of frozen weights on this rank",
        world_size,
        base_parameter_bytes(model) / 2**20,
        base_parameter_bytes(model, whole=True) / 2**20,
    )


def base_parameter_bytes(model: nn.Module, *, whole: bool = False) -> int:
    """Bytes of the frozen base's weights this rank holds (`whole`: of the whole base)."""
    total = 0
    for param in model.parameters():
        if param.requires_grad:
            continue
        held = param.to_local() if isinstance(param, DTensor) and not whole else param
        total += held.numel() * held.element_size()
    return total
