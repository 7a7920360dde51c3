"""The optimizer part of a shared-trainer update at N runs, three ways, alternately in one
process, on adapters of a model shape's real LoRA shapes with random gradients:

- `one_by_one`: each run's `clip_grad_norm_` and `AdamW.step()` one after another (the
  trainer before `workbench.trainer.optim.multi_adamw`);
- `together`: all runs at once (`clip_grad_norms_together` + `adamw_step_together`'s
  foreach operations; the trainer's way on a GPU);
- `fused`: clipping together, then each run's AdamW with torch's fused kernel (the
  trainer's way on the CPU, `workbench.trainer.optim.per_run.fused_on`).

    PYTHONPATH=$PWD .venv/bin/python scripts/optimizer_step_bench.py tiny:1,8,32,64 qwen3-0.6b:1,8

Writes benchmarks/results/optimizer-step-<time>.json: per shape and N, the median seconds of
each way over `REPEATS` alternations, and their ratios.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.optim import AdamW

from workbench.bench.publishing import DEFAULT_RANK, synthetic_adapter
from workbench.bench.results import write_result
from workbench.bench.trainer import model_config
from workbench.config import LORA_TARGET_MODULES
from workbench.trainer.optim.multi_adamw import adamw_step_together, clip_grad_norms_together

REPEATS = 15


def runs_of(shape: str, runs: int) -> list[list[torch.nn.Parameter]]:
    config = model_config(shape)
    rank = DEFAULT_RANK[shape]
    return [
        [
            torch.nn.Parameter(tensor)
            for tensor in synthetic_adapter(config, rank, list(LORA_TARGET_MODULES), seed).values()
        ]
        for seed in range(runs)
    ]


def give_gradients(runs: list[list[torch.nn.Parameter]]) -> None:
    for params in runs:
        for param in params:
            param.grad = torch.randn_like(param) * 0.1


def one_by_one(runs, optimizers) -> None:
    """The trainer before: a clip_grad_norm_ per run, one sync, an AdamW.step() per run."""
    norms = [torch.nn.utils.clip_grad_norm_(params, 1.0) for params in runs]
    torch.stack(norms).tolist()
    for optimizer in optimizers:
        optimizer.step()


def clip_together(runs) -> None:
    clip_grad_norms_together(dict(enumerate(runs)), {i: 1.0 for i in range(len(runs))})


def together(runs, optimizers) -> None:
    clip_together(runs)
    adamw_step_together(optimizers)


def fused(runs, optimizers) -> None:
    """The trainer on the CPU: clipping together, then each run's fused AdamW.step()."""
    clip_together(runs)
    for optimizer in optimizers:
        optimizer.step()


def measure(shape: str, count: int) -> dict:
    runs = runs_of(shape, count)
    plain = [AdamW(params, lr=1e-3 * (1 + i)) for i, params in enumerate(runs)]
    fused_ones = [AdamW(params, lr=1e-3 * (1 + i), fused=True) for i, params in enumerate(runs)]
    ways = (
        ("one_by_one_s", one_by_one, plain),
        ("together_s", together, plain),
        ("fused_s", fused, fused_ones),
    )
    timings: dict[str, list[float]] = {name: [] for name, _, _ in ways}
    for repeat in range(REPEATS + 1):  # the first of each warms up (state is made)
        for name, way, optimizers in ways:
            give_gradients(runs)
            started = time.perf_counter()
            way(runs, optimizers)
            if repeat:
                timings[name].append(time.perf_counter() - started)
    row = {key: round(statistics.median(values), 5) for key, values in timings.items()}
    row |= {"model": shape, "runs": count, "rank": DEFAULT_RANK[shape]}
    row["speedup"] = round(row["one_by_one_s"] / row["together_s"], 2)
    row["fused_vs_together"] = round(row["together_s"] / row["fused_s"], 2)
    print(row, flush=True)
    return row


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)  # as the trainer runs on a small machine beside vLLM
    rows = []
    for item in argv:
        shape, _, counts = item.partition(":")
        rows += [measure(shape, int(count)) for count in counts.split(",")]
    path = write_result(
        "optimizer-step",
        {"repeats": REPEATS, "threads": 1, "adapters": "synthetic, real shapes", "rows": rows},
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
