"""Adapters replicated or sharded beside a sharded base: one update's forward and backward.

The measurement behind `[trainer] base_sharding`'s choice to keep adapters whole on every
rank (`workbench/trainer/compute/sharding.py`). The trainer's rows (4 runs, random weights, the
`bench trainer` batches) go through the base sharded by FSDP2 either way; the adapters are
`replicated` (ignored by FSDP2, their gradients summed in one all-reduce, as the trainer
does) or `sharded` with the base (FSDP2 gathers them with each layer and reduce-scatters
their gradients). Only forward and backward are timed: the trainer's per-run optimizer,
norm, broadcast and checkpoint would need the sharded adapters gathered on top.

    torchrun --nproc_per_node 2 scripts/adapter_sharding.py qwen3-vocab sharded 4096 3

prints one JSON line (rank 0): the median seconds of an update, the adapter bytes one rank
holds, the tokens of an update.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from workbench.bench.trainer import model_config, synthetic_batches
from workbench.config import OrchestratorConfig, TrainerSection
from workbench.experiment import write_run
from workbench.trainer.compute.model import HostRow, RowLogprobs, decoder_layers, prepare_model
from workbench.trainer.lora.layer import apply_lora_to_model, set_lora_num_tokens
from workbench.trainer.parallel import distributed
from workbench.trainer.rl.packer import distribute, pack_batches
from workbench.trainer.runs.manager import MultiRunManager

RUNS, TOKENS, SAMPLE_LEN, RANK = 4, 8192, 512, 8


def main(shape: str, adapters: str, seq_len: int, steps: int) -> None:
    device = distributed.init_process_group()
    measure(shape, adapters, seq_len, steps, device)
    distributed.destroy_process_group()  # the model is gone: its group goes with it


def measure(shape: str, adapters: str, seq_len: int, steps: int, device: torch.device) -> None:
    torch.manual_seed(0)
    config = model_config(shape)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.config.use_cache = False
    model.eval()
    experiment = Path(tempfile.mkdtemp(prefix="workbench-adapter-sharding-"))
    for idx in range(RUNS):
        write_run(experiment, f"run_{idx}", OrchestratorConfig(lr=1e-4))
    manager = MultiRunManager(experiment, RUNS)
    if manager.is_master:
        manager.discover_runs()
    manager.synchronize_state()
    apply_lora_to_model(model, manager, RANK, 2.0 * RANK)
    section = TrainerSection(max_concurrent_runs=RUNS, seq_len=seq_len)
    row_model = RowLogprobs(model, prepare_model(model, section, device))
    mesh = init_device_mesh(device.type, (distributed.world_size(),))
    trained = {param for param in model.parameters() if param.requires_grad}
    ignored = trained if adapters == "replicated" else None
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, ignored_params=ignored)
    fully_shard(row_model, mesh=mesh, ignored_params=ignored)
    # fully_shard replaces the parameters it manages: look them up again.
    params = [param for param in model.parameters() if param.requires_grad]
    batches = synthetic_batches(RUNS, TOKENS, SAMPLE_LEN, config.vocab_size)
    rows = pack_batches(batches, seq_len, RUNS)
    mine = distribute(rows, distributed.world_size())[distributed.rank()]

    def update() -> None:
        for row in mine:
            set_lora_num_tokens(model, row.lora_num_tokens)
            host = HostRow(row.position_ids, torch.ones(row.num_tokens))
            logprobs = row_model(row.input_ids.to(device), host)
            (logprobs * row.advantages.to(device)).sum().backward()
        if adapters == "replicated":
            distributed.all_reduce_grads(params, device)
        for param in params:
            param.grad = None

    times = []
    for step in range(steps + 1):  # the first warms up
        dist.barrier()
        started = time.perf_counter()
        update()
        dist.barrier()
        if step:
            times.append(time.perf_counter() - started)
    held = sum(
        (param.to_local() if hasattr(param, "to_local") else param).numel() * param.element_size()
        for param in params
    )
    if distributed.rank() == 0:
        result = {
            "adapters": adapters,
            "median_s": sorted(times)[len(times) // 2],
            "adapter_bytes_per_rank": held,
            "tokens": sum(row.num_tokens for row in rows),
        }
        print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
