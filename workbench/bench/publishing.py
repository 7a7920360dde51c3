"""`workbench bench trainer --publishing`: what publishing every run's adapter after each
update costs, at N runs: the time and bytes to write them and to load them into vLLM.

After an update the trainer's master copies each updated run's adapter out of its slot
and checks it is finite (`workbench.trainer.runs.publisher.AdapterCopy.checked`): that copy is
all the next update waits for. The copies are then written as `broadcast/step_N/`
(`write_adapter`, the old steps pruned) on `PUBLISH_THREADS` background threads while the
next update computes. Each publication is measured that way (the copies, then the writes)
and, alternately, one run after another. Each run's orchestrator then asks vLLM to
load its new adapter (`/v1/load_lora_adapter`), which vLLM reads with
`LoRAModel.from_local_checkpoint` into its CPU cache, in its engine's loop.

Measured here in one process, with synthetic adapters (random float32 tensors of the real
shapes: the base model made on the meta device from its config, no weights), `steps`
publications of every run: the write exactly as the trainer does it, and the load with
vLLM's own loader on the CPU (`device="cpu"`, the model's dtype), without a server: the
HTTP request, the engine's queue and the copy into its GPU slots are not counted.
Per publication: the total over the N runs and the mean per run (medians over `steps`),
and the bytes of one adapter directory.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from workbench.config import LORA_TARGET_MODULES
from workbench.files import layout

# The rank each shape is published at unless one is asked for: the built-in recipe's and
# the GPU anchor's (`bench trainer --preset anchor`).
DEFAULT_RANK = {"tiny": 8, "qwen3-vocab": 8, "qwen3-0.6b": 16}
# vLLM serves the trainer's dtype: float32 for the built-in model, bfloat16 on a GPU.
SERVED_DTYPE = {"tiny": torch.float32, "qwen3-vocab": torch.bfloat16, "qwen3-0.6b": torch.bfloat16}
BASE_NAMES = {"tiny": "builtin:tiny-reverse", "qwen3-vocab": "Qwen/Qwen3-0.6B"}


@dataclass
class Publishing:
    """One shape at one N: a publication of every run's adapter."""

    model: str
    runs: int
    rank: int
    adapter_parameters: int
    adapter_bytes: int  # one adapter's directory on disk
    copy_s: float  # every run's adapter copied out and checked: what the next update waits for
    write_s: float  # then written on the publishing threads, in the background (median)
    write_ms_per_run: float
    write_one_by_one_s: float  # the same, one run after another (the trainer before)
    load_s: float  # vLLM's loader, every run's adapter
    load_ms_per_run: float
    steps: int
    adapters: str = "synthetic (random float32 tensors of the model's shapes)"
    load_as: str = "vLLM's LoRAModel.from_local_checkpoint on the CPU, no server"


def synthetic_adapter(config: Any, rank: int, targets: list[str], seed: int) -> dict:
    """A random adapter keyed as `MultiRunManager.get_state_dict_for_run` keys one
    (`model.layers.0.self_attn.q_proj.lora_A.weight`, A [r, in], B [out, r])."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            a = torch.randn(rank, module.in_features, generator=generator) * 0.01
            b = torch.randn(module.out_features, rank, generator=generator) * 0.01
            tensors[f"{name}.lora_A.weight"] = a
            tensors[f"{name}.lora_B.weight"] = b
    return tensors


def measure_publishing(shape: str, runs: int, rank: int | None, steps: int) -> Publishing:
    """Publish `runs` synthetic adapters of `shape` `steps` times: write as the trainer does,
    load as vLLM does."""
    from workbench.bench.trainer import model_config
    from workbench.trainer.runs.publisher import PUBLISH_THREADS, AdapterPublisher

    rank = rank or DEFAULT_RANK.get(shape, 8)
    config = model_config(shape)
    targets = list(LORA_TARGET_MODULES)
    adapters = [synthetic_adapter(config, rank, targets, seed) for seed in range(runs)]
    parameters = sum(tensor.numel() for tensor in adapters[0].values())
    copies, writes, one_by_one, loads = [], [], [], []
    import vllm.lora.lora_model  # noqa: F401  (its import, seconds, is not a load's time)

    with tempfile.TemporaryDirectory(prefix="bench-publish-") as scratch:
        run_dirs = [Path(scratch) / f"run_{i}" for i in range(runs)]
        publisher = AdapterPublisher()  # its buffers only: the writes are timed here
        copy_one = partial(copy_out, publisher=publisher, rank=rank, targets=targets, shape=shape)
        for step in range(2, 2 * steps + 1, 2):  # odd steps one by one, even ones at once
            started = time.perf_counter()
            for slot, (run, adapter) in enumerate(zip(run_dirs, adapters, strict=True)):
                copy_one(run, step - 1, slot, adapter).write()
            one_by_one.append(time.perf_counter() - started)
            started = time.perf_counter()
            copied = [
                copy_one(run, step, slot, adapter)
                for slot, (run, adapter) in enumerate(zip(run_dirs, adapters, strict=True))
            ]
            copies.append(time.perf_counter() - started)
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=min(PUBLISH_THREADS, runs)) as pool:
                for future in [pool.submit(copy.write) for copy in copied]:
                    future.result()
            writes.append(time.perf_counter() - started)
            started = time.perf_counter()
            for run in run_dirs:
                load_as_vllm(layout.broadcast_dir(run, step), targets, config, shape)
            loads.append(time.perf_counter() - started)
        directory = layout.broadcast_dir(run_dirs[0], 2 * steps)
        size = sum(path.stat().st_size for path in directory.iterdir() if path.is_file())
    write_s, load_s = statistics.median(writes), statistics.median(loads)
    return Publishing(
        model=shape,
        runs=runs,
        rank=rank,
        adapter_parameters=parameters,
        adapter_bytes=size,
        copy_s=round(statistics.median(copies), 4),
        write_s=round(write_s, 4),
        write_ms_per_run=round(1000 * write_s / runs, 2),
        write_one_by_one_s=round(statistics.median(one_by_one), 4),
        load_s=round(load_s, 4),
        load_ms_per_run=round(1000 * load_s / runs, 2),
        steps=steps,
    )


def copy_out(
    run: Path,
    step: int,
    slot: int,
    adapter: dict,
    *,
    publisher: Any,
    rank: int,
    targets: list[str],
    shape: str,
):
    """What the trainer's master does for one run before its next update: the slot's
    tensors copied into the publisher's buffers of the slot (`AdapterPublisher.copy_out`)
    and checked finite."""
    from workbench.trainer.runs.publisher import AdapterCopy

    return AdapterCopy.checked(
        run,
        step,
        publisher.copy_out(slot, adapter),
        rank=rank,
        alpha=2.0 * rank,
        target_modules=targets,
        base_model=BASE_NAMES.get(shape, "Qwen/Qwen3-0.6B"),
    )


def load_as_vllm(directory: Path, targets: list[str], config: Any, shape: str) -> Any:
    """vLLM's own read of an adapter directory into CPU tensors of the served dtype, as its
    worker does on `/v1/load_lora_adapter`."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    helper = PEFTHelper.from_local_dir(str(directory), config.max_position_embeddings)
    return LoRAModel.from_local_checkpoint(
        str(directory),
        set(targets),
        helper,
        device="cpu",
        dtype=SERVED_DTYPE.get(shape, torch.bfloat16),
        model_vocab_size=config.vocab_size,
    )


def run_publishing(shapes: list[str], run_counts: list[int], rank: int | None, steps: int):
    """Every shape at every N, printed as it goes; the rows as dicts."""
    rows = []
    for shape in shapes:
        for runs in run_counts:
            row = measure_publishing(shape, runs, rank, steps)
            print(
                f"publishing {shape} rank {row.rank} x {runs} runs: "
                f"{row.adapter_bytes / 2**20:.2f} MiB an adapter; copy {row.copy_s:.3f} s, "
                f"write {row.write_s:.3f} s in the background "
                f"({row.write_ms_per_run:.1f} ms a run; one by one "
                f"{row.write_one_by_one_s:.3f} s), vLLM load {row.load_s:.3f} s "
                f"({row.load_ms_per_run:.1f} ms a run)",
                flush=True,
            )
            rows.append(asdict(row))
    return rows
