"""`workbench bench trainer`: one shared trainer with N runs vs N trainers vs peft.

For each model shape and each N, the same total number of tokens per update is trained
several ways, each in a fresh process so peak memory is clean:

- shared:   one trainer process holding N runs (our multi-LoRA path: `build_trainer` +
            `train_step`) with the compute settings asked for (default: the trainer's);
- legacy:   the same with the compute of earlier releases (dense T x T attention mask, full
            logits, no recomputation), measured side by side as the "before";
- separate: N single-run trainer processes at once, each with 1/N of the tokens (what a
            user without workbench runs); memory is the sum of their peaks;
- peft:     one run with peft's LoRA layers, the same compute settings and the same loss
            (N = 1 only), the reference.

With `ranks` above one (`--ranks`), the shared trainer runs under torchrun on that many
ranks (gloo on the CPU, nccl on GPUs) twice for each N: the base `replicated` on every rank
and `sharded` over them (FSDP2, `[trainer] base_sharding`); the other modes are skipped.
Each row then also gives the frozen base's weights one rank holds, and the sharded row its
speed and base memory as ratios to the replicated one.

Throughput = total tokens / wall time of one update (median over the measured steps; for
`separate`, the slowest process's median; their processes wait for each other before every
step, so their timed steps run side by side). Memory: the peak of the measured updates
only, reset before each (the warm-up update does not count): on a GPU the CUDA allocator's
peak allocated and reserved memory; on the CPU the process's peak RSS and how much the
updates added to what the process held before them. A configuration that runs out of
memory is reported as OOM in its row; the others still run. Weights are random: shapes,
not values, decide speed. No download: models are built from their configs.

MFU (CUDA only) counts the useful FLOPs of a LoRA update of a frozen model, per token:
    4 * N_linear                      forward and input gradients of every linear (the
                                      frozen base computes no weight gradients; the LoRA
                                      matrices' are negligible), LM head included
  + 12 * layers * heads * head_dim * context      attention scores and values, forward
                                      (4 * ...) and backward (8 * ...), with `context` the
                                      mean attended length, (sample_len + 1) / 2 causally
and recomputation is not counted, as usual for MFU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_SHAPES = ("tiny", "qwen3-vocab", "qwen3-0.6b")
DEFAULT_TOKENS = {"tiny": 16384, "qwen3-vocab": 8192, "qwen3-0.6b": 1024}
DEFAULT_SEQ_LEN = {"tiny": 2048, "qwen3-vocab": 8192, "qwen3-0.6b": 512}
DEFAULT_SAMPLE_LEN = {"tiny": 64, "qwen3-vocab": 512, "qwen3-0.6b": 128}
# The compute of releases before per-sample attention, chunked log-probs and rows side by
# side on the CPU.
LEGACY_COMPUTE = {
    "attention": "dense",
    "logprob_chunk_tokens": 0,
    "activation_checkpointing": False,
    "row_threads": 1,
}
# Dense bf16 peak of the GPUs we quote MFU on (tensor cores, no sparsity).
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}


@dataclass
class Preset:
    """A named configuration: what the documented figures (docs/benchmarks/) are measured with."""

    models: list[str]
    runs: list[int]
    tokens: int
    seq_len: int
    sample_len: int
    rank: int
    about: str


PRESETS = {
    # One H100: Qwen3-0.6B shape, bf16, rank 16 on all 7 projections, 16,384 tokens per
    # update in one row, 512-token samples.
    "anchor": Preset(["qwen3-0.6b"], [1, 4, 8], 16384, 16384, 512, 16, "GPU anchor"),
    # This CPU: Qwen's real 151,936-token vocabulary on a small body, 4 runs x 2,048
    # tokens (512-token samples) in one 8,192-token row: the logits dominate memory.
    "cpu-vocab": Preset(["qwen3-vocab"], [4], 8192, 8192, 512, 8, "CPU, Qwen vocabulary"),
}


def model_config(shape: str):
    if shape == "tiny":
        from workbench.trainer.sft.tiny_reverse import TinyReverseSpec, llama_config

        return llama_config(TinyReverseSpec())
    from transformers import Qwen3Config

    if shape == "qwen3-vocab":
        return Qwen3Config(
            vocab_size=151936,
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            max_position_embeddings=40960,
            tie_word_embeddings=True,
        )
    if shape == "qwen3-0.6b":
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


def train_flops_per_token(config, sample_len: int) -> float:
    """Useful FLOPs per trained token (formula in the module docstring)."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    per_layer = (
        hidden * heads * head_dim * 2  # q and o
        + hidden * kv_heads * head_dim * 2  # k and v
        + hidden * config.intermediate_size * 3  # gate, up, down
    )
    linear_params = layers * per_layer + hidden * config.vocab_size
    context = (sample_len + 1) / 2
    return 4 * linear_params + 12 * layers * heads * head_dim * context


def peak_flops(device_name: str) -> float | None:
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return flops
    return None


# ------------------------------------------------------------------ the worker (one process)


def synthetic_batches(n_runs: int, tokens: int, sample_len: int, vocab: int):
    import torch

    from workbench.files.rollouts import TensorBatch, completion_loss_mask

    per_run = tokens // n_runs
    samples = max(1, per_run // sample_len)
    generator = torch.Generator().manual_seed(0)
    batches = {}
    for idx in range(n_runs):
        total = samples * sample_len
        prompt = sample_len // 4
        logprobs = -torch.rand(total, generator=generator) * 3
        lengths = torch.full((samples,), sample_len, dtype=torch.int64)
        prompt_lengths = torch.full((samples,), prompt, dtype=torch.int64)
        batches[idx] = TensorBatch(
            run_id=f"run_{idx}",
            step=0,
            policy_version=0,
            input_ids=torch.randint(3, vocab, (total,), generator=generator),
            sample_lengths=lengths,
            prompt_lengths=prompt_lengths,
            loss_mask=completion_loss_mask(lengths, prompt_lengths),
            inference_logprobs=logprobs,
            advantages=torch.randn(samples, generator=generator),
            rewards=torch.rand(samples, generator=generator),
        )
    return batches


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@dataclass
class WorkerSpec:
    """One worker process's job (passed as JSON on its command line)."""

    mode: str  # shared | peft
    shape: str
    runs: int
    tokens: int
    seq_len: int
    sample_len: int
    rank: int
    steps: int
    compute: dict[str, Any] = field(default_factory=dict)
    # Separate trainers: a directory where `parties` processes meet before every step.
    barrier: str = ""
    parties: int = 1
    ranks: int = 1  # torchrun ranks of the shared trainer
    # The runs' `loss.kind`s, one per run in turn (empty: every run the default).
    losses: list[str] = field(default_factory=list)


class PeerFailed(RuntimeError):
    """Another process of the same measurement stopped before a step everyone waits for."""


def _meet_peers(spec: WorkerSpec, step: int, timeout_s: float = 1800.0) -> None:
    """Wait until every process of the measurement has reached `step` (a file barrier)."""
    if not spec.barrier:
        return
    directory = Path(spec.barrier)
    (directory / f"step{step}.{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(directory.glob(f"step{step}.*"))) < spec.parties:
        if (directory / "failed").exists():
            raise PeerFailed("another separate trainer failed")
        if time.monotonic() > deadline:
            raise PeerFailed(f"the other separate trainers did not reach step {step}")
        time.sleep(0.005)


def run_worker(spec: WorkerSpec) -> dict[str, Any]:
    """Measure one configuration; {"oom": why} if it ran out of memory."""
    import torch

    from workbench.trainer.parallel import distributed

    try:
        result = _measure_worker(spec)
        # After the measurement's models are gone (distributed.destroy_process_group).
        distributed.destroy_process_group()
        return result
    except (torch.OutOfMemoryError, RuntimeError) as err:
        _tell_peers_failed(spec)
        # The CPU allocator's failure is a plain RuntimeError.
        if isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in str(err):
            return {"oom": str(err).splitlines()[0][:300]}
        raise
    except BaseException:
        _tell_peers_failed(spec)
        raise


def _tell_peers_failed(spec: WorkerSpec) -> None:
    if spec.barrier:
        (Path(spec.barrier) / "failed").touch()


def _measure_worker(spec: WorkerSpec) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from workbench.trainer.parallel import distributed
    from workbench.trainer.rl.packer import distribute, pack_batches

    device = distributed.init_process_group()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    config = model_config(spec.shape)
    with device:  # random weights drawn where they are used: no host copy of the model
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    model = model.to(device).eval()
    rows = pack_batches(
        synthetic_batches(spec.runs, spec.tokens, spec.sample_len, config.vocab_size),
        spec.seq_len,
        spec.runs,
    )
    tokens = sum(row.num_tokens for row in rows)
    # Under torchrun every rank packs the same rows and trains its share, as the trainer's
    # master would hand them out.
    shares = distribute(rows, distributed.world_size())
    rows = shares[distributed.rank()]
    step, described, lora = (_peft_step if spec.mode == "peft" else _shared_step)(
        model, rows, spec, device, max(map(len, shares))
    )
    baseline_rss = _current_rss_mb()
    times, spans, peaks = [], [], []
    for i in range(spec.steps + 1):  # the first step warms up allocators and kernels
        _meet_peers(spec, i)
        reset_peak_memory(device)
        started, started_at = time.perf_counter(), time.time()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - started)
            spans.append((started_at, time.time()))
            peaks.append(peak_memory(device))
    result = {
        "step_s": times,
        "step_spans": spans,  # wall-clock (start, end) of each timed step
        "tokens": tokens,
        "rows": sum(map(len, shares)),
        "compute": described,
        "lora": lora,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        **{key: max(peak[key] for peak in peaks) for key in peaks[0]},
    }
    if "peak_rss_mb" in result:
        result["added_rss_mb"] = max(0.0, result["peak_rss_mb"] - baseline_rss)
    if spec.mode != "peft":
        from workbench.trainer.compute.sharding import base_parameter_bytes

        result["base_mb"] = base_parameter_bytes(model) / 2**20
    return _worst_rank(result)


def _worst_rank(result: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's result with each memory figure the largest of any rank's (one rank: as is)."""
    import torch.distributed as dist

    from workbench.trainer.parallel import distributed

    if distributed.world_size() == 1:
        return result
    everyone: list[dict[str, Any]] = [{} for _ in range(distributed.world_size())]
    dist.all_gather_object(everyone, result)
    for key in ("peak_rss_mb", "added_rss_mb", "peak_cuda_mb", "peak_reserved_mb", "base_mb"):
        if key in result:
            result[key] = max(other[key] for other in everyone)
    return result


def reset_peak_memory(device) -> None:
    """Start a new peak: the CUDA allocator's, or on the CPU the kernel's peak RSS (VmHWM)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass  # the peak then spans the whole process, set-up included


def peak_memory(device) -> dict[str, float]:
    """Peaks since `reset_peak_memory`, in MB."""
    import torch

    if device.type == "cuda":
        return {
            "peak_cuda_mb": torch.cuda.max_memory_allocated(device) / 2**20,
            "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
        }
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return {"peak_rss_mb": int(line.split()[1]) / 1024}
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _trainer_section(spec: WorkerSpec):
    from workbench.config import LoraConfig, TrainerSection

    return TrainerSection(
        max_concurrent_runs=spec.runs,
        seq_len=spec.seq_len,
        lora=LoraConfig(rank=spec.rank, alpha=2 * spec.rank),
        **spec.compute,
    )


def bench_loss(name: str):
    """A run's loss from its `--losses` name: a kind, with `+kl` a k3 KL term to the base
    (coefficient 0.01), which costs one more forward of every row holding the run."""
    from workbench.config import loss_config

    kind, _, extra = name.partition("+")
    if extra not in ("", "kl"):
        raise ValueError(f"{name!r}: the one suffix is +kl (a KL term to the base model)")
    return loss_config(kind, base_kl_coef=0.01 if extra else 0.0)


def _shared_step(model, rows, spec: WorkerSpec, device, rows_per_rank: int):
    from workbench.config import DefaultLoss, ModelSection, OrchestratorConfig, TrainerConfig
    from workbench.experiment import write_run
    from workbench.trainer.lora.layer import lora_compute_summary
    from workbench.trainer.rl.trainer import build_trainer, train_step

    experiment = Path(tempfile.mkdtemp(prefix="workbench-bench-"))
    for idx in range(spec.runs):
        loss = bench_loss(spec.losses[idx % len(spec.losses)]) if spec.losses else DefaultLoss()
        write_run(experiment, f"run_{idx}", OrchestratorConfig(lr=1e-4, loss=loss))
    config = TrainerConfig(
        output_dir=experiment, model=ModelSection(base="random"), trainer=_trainer_section(spec)
    )
    trainer = build_trainer(config, model, device)
    if trainer.manager.is_master:
        trainer.manager.discover_runs()
    trainer.manager.synchronize_state()

    def step() -> None:
        for idx in trainer.manager.used_idxs:
            trainer.manager.ready_to_update[idx] = True
        train_step(trainer, rows, rows_per_rank)

    described = trainer.row_model.plan.describe()
    if trainer.row_threads is not None:
        described += f", {trainer.row_threads.threads} rows at once"
    if spec.ranks > 1:
        described += f", base {'sharded' if trainer.base_sharded else 'replicated'}"
    return step, described, lora_compute_summary(trainer.model)


def _peft_step(model, rows, spec: WorkerSpec, device, rows_per_rank: int):
    import torch
    from peft import LoraConfig, get_peft_model

    from workbench.config import LORA_TARGET_MODULES, DefaultLoss
    from workbench.trainer.compute.model import packed_row_logprobs, prepare_model
    from workbench.trainer.rl.loss import compute_rl_loss

    # The same attention, log-prob and recomputation settings: only the LoRA layers differ.
    plan = prepare_model(model, _trainer_section(spec), device)
    lora = LoraConfig(
        r=spec.rank, lora_alpha=2 * spec.rank, target_modules=list(LORA_TARGET_MODULES)
    )
    peft_model = get_peft_model(model, lora)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def step() -> None:
        for row in rows:
            ids = row.input_ids.to(device)
            logprobs = packed_row_logprobs(
                peft_model, plan, ids, row.position_ids, torch.ones(ids.numel(), device=device)
            )
            out = compute_rl_loss(
                logprobs,
                row.inference_logprobs.to(device),
                row.advantages.to(device),
                row.loss_mask.to(device),
                torch.tensor([ids.numel()]),
                DefaultLoss(),
                loss_tokens_per_run=row.run_loss_tokens[:1],
            )
            out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, plan.describe(), "peft"


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
    seq_len: int = 0
    sample_len: int = 0
    rank: int = 0
    compute: str = ""
    device: str = ""
    dtype: str = ""
    added_memory_mb: float = float("nan")  # CPU: RSS the updates added; CUDA: the peak
    reserved_memory_mb: float | None = None  # CUDA: the caching allocator's peak reserved
    lora: str = ""  # which LoRA compute ran: grouped matmul, per-run loop (why), or peft
    mfu: float | None = None
    vs_peft: float | None = None
    vs_separate_speed: float | None = None
    vs_separate_memory: float | None = None
    ranks: int = 1
    base_mb: float | None = None  # the frozen base's weights one rank holds
    vs_replicated_speed: float | None = None
    vs_replicated_base_memory: float | None = None
    losses: str = ""  # the runs' loss kinds (`--losses`), in turn
    vs_uniform: float | None = None  # mixed: tokens/s over the uniform row's (same N)


def _spawn(spec: WorkerSpec, threads: int | None = None):
    env = dict(os.environ)
    # As the supervisor does for its children: several processes computing on the same
    # cores must not spin-wait (see supervisor.plan.shared_cpu_env).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    launcher = [sys.executable]
    if spec.ranks > 1:
        from workbench.system.ports import free_port

        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(spec.ranks)]
        launcher += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    command = [*launcher, "-m", "workbench.bench.trainer", "--worker", json.dumps(spec.__dict__)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


class OutOfMemory(RuntimeError):
    """A configuration did not fit: its row says so and the benchmark goes on."""


def _collect(process: subprocess.Popen) -> dict[str, Any]:
    out, err = process.communicate()
    if process.returncode == -signal.SIGKILL:
        raise OutOfMemory("killed (SIGKILL: the kernel's out-of-memory killer?)")
    if process.returncode != 0:
        # Under torchrun the workers' lines carry a `[rankN]:` prefix; the agent's report
        # after them says only that a child failed.
        workers = "\n".join(line for line in err.splitlines() if line.startswith("[rank"))
        detail = (workers or err)[-3000:]
        raise RuntimeError(f"benchmark worker failed ({process.returncode}):\n{detail}")
    result = json.loads(out.strip().splitlines()[-1])
    if "oom" in result:
        raise OutOfMemory(result["oom"])
    return result


def _collect_all(processes: list[subprocess.Popen]) -> list[dict[str, Any]]:
    """Every process's result; the first out-of-memory (or failure) once all have ended."""
    results, problems = [], []
    for process in processes:
        try:
            results.append(_collect(process))
        except (OutOfMemory, RuntimeError) as err:
            problems.append(err)
    ooms = [p for p in problems if isinstance(p, OutOfMemory)]
    if ooms or problems:
        raise (ooms or problems)[0]
    return results


def _memory(result: dict[str, Any]) -> tuple[float, float]:
    if "peak_cuda_mb" in result:
        return result["peak_cuda_mb"], result["peak_cuda_mb"]
    return result["peak_rss_mb"], result["added_rss_mb"]


def run_side_by_side(spec: WorkerSpec, processes: int) -> list[dict[str, Any]]:
    """`processes` workers of `spec` at once, meeting before every step (see `_meet_peers`)."""
    with tempfile.TemporaryDirectory(prefix="workbench-bench-barrier-") as barrier:
        together = WorkerSpec(**{**spec.__dict__, "barrier": barrier, "parties": processes})
        return _collect_all([_spawn(together) for _ in range(processes)])


def _reserved(results: list[dict[str, Any]]) -> float | None:
    values = [r["peak_reserved_mb"] for r in results if "peak_reserved_mb" in r]
    return sum(values) if values else None


def measure(spec: WorkerSpec, mode: str) -> Measurement:
    """Run `spec` as `mode` (shared, legacy, separate or peft) and measure it; a
    configuration that runs out of memory comes back as a row saying OOM."""
    common = {"seq_len": spec.seq_len, "sample_len": spec.sample_len, "rank": spec.rank}
    processes = spec.runs if mode == "separate" else 1
    try:
        return _measure(spec, mode, common)
    except OutOfMemory as err:
        nan = float("nan")
        return Measurement(
            spec.shape, mode, spec.runs, spec.tokens, nan, nan, nan, processes,
            note=f"OOM: {err}", **common,
        )  # fmt: skip


def _measure(spec: WorkerSpec, mode: str, common: dict[str, int]) -> Measurement:
    from workbench.bench.results import median

    shape = spec.shape
    if mode == "separate":
        # N trainers side by side share the device, as they would on the user's machine;
        # they meet before every step so that their timed steps overlap.
        one = WorkerSpec(**{**spec.__dict__, "mode": "shared", "runs": 1})
        one.tokens = spec.tokens // spec.runs
        results = run_side_by_side(one, spec.runs)
        step_s = max(median(r["step_s"]) for r in results)
        peak = sum(_memory(r)[0] for r in results)
        added = sum(_memory(r)[1] for r in results)
        trained = sum(r["tokens"] for r in results)
        first = results[0]
        return Measurement(
            shape, mode, spec.runs, trained, step_s, trained / step_s, peak, spec.runs,
            compute=first["compute"], device=first["device"], dtype=first["dtype"],
            added_memory_mb=added, reserved_memory_mb=_reserved(results), lora=first["lora"],
            **common,
        )  # fmt: skip
    worker = WorkerSpec(**{**spec.__dict__, "mode": "peft" if mode == "peft" else "shared"})
    if mode == "peft":
        worker.runs = 1
    if mode == "legacy":
        worker.compute = dict(LEGACY_COMPUTE)
    if mode == "uniform":
        worker.losses = spec.losses[:1]
    if mode in ("replicated", "sharded"):
        worker.compute = {**worker.compute, "base_sharding": mode}
    else:
        worker.ranks = 1
    result = _collect(_spawn(worker))
    step_s = median(result["step_s"])
    peak, added = _memory(result)
    return Measurement(
        shape, mode, worker.runs, result["tokens"], step_s, result["tokens"] / step_s, peak,
        worker.ranks, compute=result["compute"], device=result["device"], dtype=result["dtype"],
        added_memory_mb=added, reserved_memory_mb=_reserved([result]), lora=result["lora"],
        ranks=worker.ranks, base_mb=result.get("base_mb"), losses=",".join(worker.losses),
        **common,
    )  # fmt: skip


def available_memory_mb() -> float:
    from workbench.system.procfs import memory_available_bytes

    available = memory_available_bytes()
    return float("inf") if available is None else available / (1 << 20)


@dataclass
class BenchSettings:
    """What `workbench bench trainer` measures; None fields take each shape's default."""

    models: list[str]
    run_counts: list[int]
    steps: int = 3
    tokens: int | None = None
    seq_len: int | None = None
    sample_len: int | None = None
    rank: int = 8
    compute: dict[str, Any] = field(default_factory=dict)
    legacy: bool = True  # also measure the legacy compute, side by side
    separate: bool = True
    peft: bool = True
    ranks: int = 1  # above one: the shared trainer under torchrun, base replicated and sharded
    # Loss kinds: with two or more, each N is measured as `uniform` (every run the first
    # kind) and `mixed` (the kinds in turn), alternately `pairs` times, instead of the
    # other modes.
    losses: list[str] = field(default_factory=list)
    pairs: int = 2

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> BenchSettings:
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        preset = PRESETS[name]
        settings = cls(
            models=preset.models,
            run_counts=preset.runs,
            tokens=preset.tokens,
            seq_len=preset.seq_len,
            sample_len=preset.sample_len,
            rank=preset.rank,
        )
        for key, value in overrides.items():
            setattr(settings, key, value)
        return settings


def run_benchmark(settings: BenchSettings) -> list[Measurement]:
    from rich.console import Console

    console = Console(stderr=True)
    measurements: list[Measurement] = []
    for shape in settings.models:
        spec = _shape_spec(settings, shape)
        console.print(
            f"[bold]{shape}[/]: {spec.tokens} tokens per update, rows of {spec.seq_len}, "
            f"samples of {spec.sample_len}, rank {spec.rank}"
        )

        def run(mode: str, n: int, spec: WorkerSpec = spec) -> Measurement:
            console.print(f"  {mode} x{n} ...", end="")
            m = measure(WorkerSpec(**{**spec.__dict__, "runs": n}), mode)
            if m.note:
                console.print(f" {m.note}")
            else:
                console.print(
                    f" {m.tokens_per_s:,.0f} tok/s, {m.peak_memory_mb:,.0f} MB peak "
                    f"({m.compute}; LoRA: {m.lora})"
                )
            measurements.append(m)
            return m

        if len(settings.losses) > 1:
            for n in settings.run_counts:
                for _ in range(settings.pairs):  # alternately, so drift hits both alike
                    run("uniform", n)
                    run("mixed", n)
        elif settings.ranks > 1:
            for n in settings.run_counts:
                run("replicated", n)
                run("sharded", n)
        else:
            _shared_against_the_rest(settings, spec, run, measurements.append)
    add_ratios(measurements)
    return measurements


def _shape_spec(settings: BenchSettings, shape: str) -> WorkerSpec:
    """One model shape's worker settings (one run; each measurement sets its count)."""
    if shape not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; choose from {', '.join(MODEL_SHAPES)}")
    return WorkerSpec(
        mode="shared",
        shape=shape,
        runs=1,
        tokens=settings.tokens or DEFAULT_TOKENS[shape],
        seq_len=settings.seq_len or DEFAULT_SEQ_LEN[shape],
        sample_len=settings.sample_len or DEFAULT_SAMPLE_LEN[shape],
        rank=settings.rank,
        steps=settings.steps,
        compute=dict(settings.compute),
        ranks=settings.ranks,
        losses=list(settings.losses),
    )


def _shared_against_the_rest(
    settings: BenchSettings,
    spec: WorkerSpec,
    run: Callable[[str, int], Measurement],
    add: Callable[[Measurement], None],
) -> None:
    """peft with one adapter, then at each N the shared trainer, the legacy compute (at the
    first and last N) and N separate trainers; `run` measures and records, `add` records
    a row saying why N separate trainers were skipped (memory)."""
    if settings.peft:
        run("peft", 1)
    single_mb = None
    for n in settings.run_counts:
        shared = run("shared", n)
        if single_mb is None and math.isfinite(shared.peak_memory_mb):
            single_mb = shared.peak_memory_mb
        if settings.legacy and n in (settings.run_counts[0], settings.run_counts[-1]):
            run("legacy", n)
        if not settings.separate or n == 1:
            continue  # one separate trainer is the shared one with one run
        if single_mb is not None and single_mb * n > 0.8 * available_memory_mb():
            add(
                Measurement(spec.shape, "separate", n, spec.tokens, float("nan"), float("nan"),
                            single_mb * n, n, note=f"skipped: needs ~{single_mb * n / 1024:.0f} GiB")
            )  # fmt: skip
            continue
        run("separate", n)


def add_ratios(measurements: list[Measurement]) -> None:
    """Fill in MFU and each shared measurement's ratios to peft and to N separate trainers."""
    for m in measurements:
        flops = peak_flops(m.device)
        if flops and m.tokens_per_s == m.tokens_per_s:
            per_token = train_flops_per_token(model_config(m.model), m.sample_len)
            m.mfu = m.tokens_per_s * per_token / flops
        if m.mode == "sharded":
            _add_replicated_ratios(m, measurements)
        if m.mode == "mixed":
            _add_uniform_ratio(m, measurements)
        if m.mode not in ("shared", "legacy") or not math.isfinite(m.tokens_per_s):
            continue
        for other in measurements:
            if other.model != m.model or other.tokens_per_s != other.tokens_per_s:
                continue
            if other.mode == "peft":
                m.vs_peft = m.tokens_per_s / other.tokens_per_s
            if other.mode == "separate" and other.runs == m.runs:
                m.vs_separate_speed = m.tokens_per_s / other.tokens_per_s
                m.vs_separate_memory = m.peak_memory_mb / other.peak_memory_mb


def _add_uniform_ratio(mixed: Measurement, measurements: list[Measurement]) -> None:
    """The mixed row's speed over the median of the uniform rows of the same model and N."""
    from workbench.bench.results import median

    uniform = [
        m.tokens_per_s
        for m in measurements
        if m.mode == "uniform"
        and (m.model, m.runs) == (mixed.model, mixed.runs)
        and math.isfinite(m.tokens_per_s)
    ]
    if uniform and math.isfinite(mixed.tokens_per_s):
        mixed.vs_uniform = mixed.tokens_per_s / median(uniform)


def _add_replicated_ratios(sharded: Measurement, measurements: list[Measurement]) -> None:
    for other in measurements:
        same = (other.model, other.runs, other.ranks) == (
            sharded.model,
            sharded.runs,
            sharded.ranks,
        )
        if other.mode == "replicated" and same and other.base_mb:
            sharded.vs_replicated_speed = sharded.tokens_per_s / other.tokens_per_s
            if sharded.base_mb is not None:
                sharded.vs_replicated_base_memory = sharded.base_mb / other.base_mb


def print_table(measurements: list[Measurement]) -> None:
    from rich.table import Table

    from workbench.system.console import output_console

    def ratio(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else ""

    table = Table(title="trainer: tokens/s and memory per update (same total tokens)")
    columns = ("model", "mode", "runs", "ranks", "tokens", "step s", "tokens/s", "MFU",
               "peak MB", "added MB", "reserved MB", "base MB / rank", "vs peft",
               "vs separate (speed / memory)", "vs replicated (speed / base memory)",
               "vs uniform", "LoRA", "compute / note")  # fmt: skip
    for column in columns:
        left = column in ("model", "mode", "LoRA", "compute / note")
        table.add_column(column, justify="left" if left else "right")
    for m in measurements:
        table.add_row(
            m.model, m.mode, str(m.runs), str(m.ranks), str(m.tokens), f"{m.step_s:.3f}",
            f"{m.tokens_per_s:,.0f}",
            f"{m.mfu:.1%}" if m.mfu is not None else "n/a", f"{m.peak_memory_mb:,.0f}",
            f"{m.added_memory_mb:,.0f}",
            f"{m.reserved_memory_mb:,.0f}" if m.reserved_memory_mb is not None else "n/a",
            f"{m.base_mb:,.1f}" if m.base_mb is not None else "",
            ratio(m.vs_peft),
            f"{ratio(m.vs_separate_speed)} / {ratio(m.vs_separate_memory)}" if m.vs_separate_speed else "",
            f"{ratio(m.vs_replicated_speed)} / {ratio(m.vs_replicated_base_memory)}"
            if m.vs_replicated_speed else "",
            ratio(m.vs_uniform),
            m.lora,
            m.note or (f"losses {m.losses}; {m.compute}" if m.losses else m.compute),
        )  # fmt: skip
    console = output_console()  # tables whole when piped or logged
    console.print(table)
    console.print(
        "MFU = tokens/s x (4 x linear params + 12 x layers x heads x head_dim x "
        "(sample_len + 1) / 2) / peak bf16 FLOP/s (CUDA only). Memory is the peak of the "
        "measured updates (warm-up excluded). added MB: on the CPU, RSS the updates added to "
        "the process; on a GPU, the allocator's peak. reserved MB: the CUDA caching "
        "allocator's peak reserved memory."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", help="a WorkerSpec as JSON (the driver passes it)")
    args = parser.parse_args(argv)
    if args.worker:
        result = run_worker(WorkerSpec(**json.loads(args.worker)))
        if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for all
            print(json.dumps(result))
        return 0
    parser.error("the driver runs through `workbench bench trainer`")
    return 2


if __name__ == "__main__":
    sys.exit(main())
