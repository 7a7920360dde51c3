"""The optimizer part of a shared-trainer update at N runs: each run's `clip_grad_norm_` and
`AdamW.step()` one after another (the trainer before `workbench.trainer.multi_adamw`) against
all runs at once (`clip_grad_norms_together` + `adamw_step_together`), alternately in one
process, on adapters of a model shape's real LoRA shapes with random gradients.

    PYTHONPATH=$PWD .venv/bin/python scripts/optimizer_step_bench.py tiny:1,8,32 qwen3-0.6b:1,8

Writes benchmarks/results/optimizer-step-<time>.json: per shape and N, the median seconds of
each way over `REPEATS` alternations, and their ratio.
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
from workbench.trainer.multi_adamw import adamw_step_together, clip_grad_norms_together

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


def together(runs, optimizers) -> None:
    clip_grad_norms_together(dict(enumerate(runs)), {i: 1.0 for i in range(len(runs))})
    adamw_step_together(optimizers)


def measure(shape: str, count: int) -> dict:
    runs = runs_of(shape, count)
    optimizers = [AdamW(params, lr=1e-3 * (1 + i)) for i, params in enumerate(runs)]
    timings: dict[str, list[float]] = {"one_by_one_s": [], "together_s": []}
    for repeat in range(REPEATS + 1):  # the first of each warms up (state is made)
        for name, way in (("one_by_one_s", one_by_one), ("together_s", together)):
            give_gradients(runs)
            started = time.perf_counter()
            way(runs, optimizers)
            if repeat:
                timings[name].append(time.perf_counter() - started)
    row = {key: round(statistics.median(values), 5) for key, values in timings.items()}
    row |= {"model": shape, "runs": count, "rank": DEFAULT_RANK[shape]}
    row["speedup"] = round(row["one_by_one_s"] / row["together_s"], 2)
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
