"""`workbench bench trainer`: one shared trainer with N runs vs N trainers vs peft.

For each model shape and each N, the same total number of tokens per update is trained
three ways, each in fresh processes so peak memory is clean:

- shared:   one trainer process holding N runs (our MultiLoRA path: `train_step`);
- separate: N single-run trainer processes at once, each with 1/N of the tokens (what a
            user without workbench runs); memory is the sum of their peaks;
- peft:     one run with peft's LoRA and the same loss (N = 1 only), the reference.

Throughput = total tokens / wall time of one update (median over the measured steps; for
`separate`, the slowest process's median, since they run side by side). Weights are random:
shapes, not values, decide speed. No download: models are built from their configs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_SHAPES = ("tiny", "qwen3-0.6b")
DEFAULT_TOKENS = {"tiny": 16384, "qwen3-0.6b": 1024}
DEFAULT_SEQ_LEN = {"tiny": 2048, "qwen3-0.6b": 512}
SAMPLE_LEN = {"tiny": 64, "qwen3-0.6b": 128}


def model_config(shape: str):
    if shape == "tiny":
        from workbench.models.tiny_reverse import TinyReverseSpec, llama_config

        return llama_config(TinyReverseSpec())
    if shape == "qwen3-0.6b":
        from transformers import Qwen3Config

        return Qwen3Config(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
        )
    raise ValueError(f"unknown model shape {shape!r}; choose from {', '.join(MODEL_SHAPES)}")


# ------------------------------------------------------------------ the worker (one process)


def _synthetic_batches(n_runs: int, tokens: int, sample_len: int, vocab: int):
    import torch

    from workbench.rollouts import TensorBatch

    per_run = tokens // n_runs
    samples = max(1, per_run // sample_len)
    generator = torch.Generator().manual_seed(0)
    batches = {}
    for idx in range(n_runs):
        total = samples * sample_len
        prompt = sample_len // 4
        logprobs = -torch.rand(total, generator=generator) * 3
        lengths = torch.full((samples,), sample_len, dtype=torch.int64)
        batches[idx] = TensorBatch(
            run_id=f"run_{idx}",
            step=0,
            policy_version=0,
            input_ids=torch.randint(3, vocab, (total,), generator=generator),
            sample_lengths=lengths,
            prompt_lengths=torch.full((samples,), prompt, dtype=torch.int64),
            inference_logprobs=logprobs,
            advantages=torch.randn(samples, generator=generator),
            rewards=torch.rand(samples, generator=generator),
        )
    return batches


def _peak_memory_mb(device) -> dict[str, float]:
    import torch

    peak = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        peak["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return peak


def run_worker(
    mode: str, shape: str, n_runs: int, tokens: int, seq_len: int, steps: int
) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from workbench.trainer.packer import pack_batches

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    config = model_config(shape)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    model = model.to(device).eval()
    rows = pack_batches(
        _synthetic_batches(n_runs, tokens, SAMPLE_LEN[shape], config.vocab_size), seq_len, n_runs
    )
    step = (
        _shared_step(model, rows, n_runs, seq_len, device)
        if mode != "peft"
        else _peft_step(model, rows, device)
    )
    times = []
    for i in range(steps + 1):  # the first step warms up allocators and kernels
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - started)
    trained = sum(row.num_tokens for row in rows)
    return {"step_s": times, "tokens": trained, **_peak_memory_mb(device)}


def _shared_step(model, rows, n_runs: int, seq_len: int, device):
    from workbench.config import ModelSection, TrainerConfig, TrainerSection
    from workbench.trainer.rl import build_trainer, train_step

    experiment = Path(tempfile.mkdtemp(prefix="workbench-bench-"))
    for idx in range(n_runs):
        control = experiment / f"run_{idx}" / "control"
        control.mkdir(parents=True)
        (control / "orch.toml").write_text("lr = 1e-4\n")
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base="random"),
        trainer=TrainerSection(max_concurrent_runs=n_runs, seq_len=seq_len),
    )
    trainer = build_trainer(config, model, device)
    trainer.manager.discover_runs()
    trainer.manager.synchronize_state()

    def step() -> None:
        for idx in trainer.manager.used_idxs:
            trainer.manager.ready_to_update[idx] = True
        train_step(trainer, rows)

    return step


def _peft_step(model, rows, device):
    import torch
    from peft import LoraConfig, get_peft_model

    from workbench.config import LossConfig
    from workbench.trainer.attention import packed_attention_mask
    from workbench.trainer.loss import compute_logprobs, compute_rl_loss

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def step() -> None:
        for row in rows:
            ids = row.input_ids.to(device)
            positions = row.position_ids.to(device)
            logits = peft_model(
                input_ids=ids[None],
                position_ids=positions[None],
                attention_mask=packed_attention_mask(positions),
            ).logits[0]
            out = compute_rl_loss(
                compute_logprobs(logits, ids),
                row.inference_logprobs.to(device),
                row.advantages.to(device),
                row.loss_mask.to(device),
                torch.tensor([ids.numel()]),
                LossConfig(),
                loss_tokens_per_run=row.run_loss_tokens[:1],
            )
            out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


# ------------------------------------------------------------------ the driver


@dataclass
class Measurement:
    model: str
    mode: str
    runs: int
    tokens: int
    step_s: float
    tokens_per_s: float
    peak_memory_mb: float
    processes: int
    note: str = ""


def _spawn(
    mode: str, shape: str, n_runs: int, tokens: int, seq_len: int, steps: int, threads: int | None
):
    env = dict(os.environ)
    # As the supervisor does for its children: several processes computing on the same
    # cores must not spin-wait (see supervisor.plan.shared_cpu_env).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    command = [
        sys.executable, "-m", "workbench.bench.trainer", "--worker", mode,
        "--model", shape, "--runs", str(n_runs), "--tokens", str(tokens),
        "--seq-len", str(seq_len), "--steps", str(steps),
    ]  # fmt: skip
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _collect(process: subprocess.Popen) -> dict[str, Any]:
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"benchmark worker failed ({process.returncode}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def measure(
    shape: str, mode: str, n_runs: int, tokens: int, seq_len: int, steps: int
) -> Measurement:
    from workbench.bench.results import median

    if mode == "separate":
        # N trainers side by side share the cores, as they would on the user's machine.
        processes = [
            _spawn("shared", shape, 1, tokens // n_runs, seq_len, steps, None)
            for _ in range(n_runs)
        ]
        results = [_collect(p) for p in processes]
        step_s = max(median(r["step_s"]) for r in results)
        memory = sum(r.get("peak_cuda_mb", r["peak_rss_mb"]) for r in results)
        trained = sum(r["tokens"] for r in results)
        return Measurement(shape, mode, n_runs, trained, step_s, trained / step_s, memory, n_runs)
    result = _collect(_spawn(mode, shape, n_runs, tokens, seq_len, steps, None))
    step_s = median(result["step_s"])
    memory = result.get("peak_cuda_mb", result["peak_rss_mb"])
    return Measurement(
        shape, mode, n_runs, result["tokens"], step_s, result["tokens"] / step_s, memory, 1
    )


def available_memory_mb() -> float:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


def run_benchmark(
    models: list[str], run_counts: list[int], steps: int, tokens: dict[str, int] | None = None
) -> list[Measurement]:
    from rich.console import Console

    console = Console(stderr=True)
    measurements: list[Measurement] = []
    for shape in models:
        total = (tokens or {}).get(shape, DEFAULT_TOKENS[shape])
        seq_len = DEFAULT_SEQ_LEN[shape]
        console.print(f"[bold]{shape}[/]: {total} tokens per update, rows of {seq_len}")
        peft = measure(shape, "peft", 1, total, seq_len, steps)
        measurements.append(peft)
        single_mb = None
        for n in run_counts:
            for mode in ("shared", "separate"):
                if mode == "separate" and n == 1:
                    continue  # identical to shared with one run
                if mode == "separate" and single_mb and single_mb * n > 0.8 * available_memory_mb():
                    measurements.append(
                        Measurement(shape, mode, n, total, float("nan"), float("nan"), single_mb * n, n,
                                    note=f"skipped: needs ~{single_mb * n / 1024:.0f} GiB")
                    )  # fmt: skip
                    continue
                console.print(f"  {mode} x{n} ...", end="")
                m = measure(shape, mode, n, total, seq_len, steps)
                console.print(f" {m.tokens_per_s:,.0f} tok/s, {m.peak_memory_mb:,.0f} MB")
                measurements.append(m)
                if mode == "shared" and n == 1:
                    single_mb = m.peak_memory_mb
    return measurements


def print_table(measurements: list[Measurement]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="trainer: tokens/s and peak memory per update (same total tokens)")
    for column in (
        "model",
        "mode",
        "runs",
        "tokens",
        "step s",
        "tokens/s",
        "vs peft",
        "peak MB",
        "note",
    ):
        table.add_column(
            column, justify="right" if column not in ("model", "mode", "note") else "left"
        )
    peft = {m.model: m.tokens_per_s for m in measurements if m.mode == "peft"}
    for m in measurements:
        ratio = (
            m.tokens_per_s / peft[m.model]
            if m.model in peft and m.tokens_per_s == m.tokens_per_s
            else float("nan")
        )
        table.add_row(
            m.model, m.mode, str(m.runs), str(m.tokens), f"{m.step_s:.3f}", f"{m.tokens_per_s:,.0f}",
            f"{ratio:.2f}x", f"{m.peak_memory_mb:,.0f}", m.note,
        )  # fmt: skip
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", choices=("shared", "peft"))
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.worker:
        result = run_worker(
            args.worker, args.model, args.runs, args.tokens, args.seq_len, args.steps
        )
        print(json.dumps(result))
        return 0
    parser.error("the driver runs through `workbench bench trainer`")
    return 2


if __name__ == "__main__":
    sys.exit(main())
