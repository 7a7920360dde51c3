"""`workbench bench inference`: completion tokens/s of one vLLM server serving N LoRA adapters
vs the base model.

One server is started the way the supervisor starts it (`python -m workbench.inference` on
an `InferenceConfig`: the built-in tiny model, float32, `--max-loras 8`, LoRA rank 8) and
eight random rank-8 adapters are loaded into it. The same workload (reverse_text prompts
from a fixed seed, `n` completions each, fixed `max_tokens`, temperature 1.0, log-probs on:
the orchestrator's request) is then sent with every request targeting:

- the base model;
- 1 adapter;
- 2, 4 or 8 adapters, requests spread round-robin over them.

One request per prompt, all in flight at once from a thread pool, as an orchestrator sends
them, so vLLM batches requests for different adapters together. Requests ask for
`ignore_eos`: every completion is exactly `max_tokens` long, so each configuration does the
same work (random adapters would otherwise ramble to the limit while the base model stops
early, and tokens/s would compare different batch shapes). Throughput = completion tokens
(as the server counts them) / wall time of the whole batch of requests.

Every configuration gets one untimed warm-up pass, then the repetitions are interleaved
(base, 1, 2, 4, 8, base, 1, ...) so a change in the machine's background load spreads over
all configurations instead of biasing the last ones. The median over repetitions is
reported, with its ratio to the base model's median. Server startup (spawn to health) and
adapter loading times are recorded too, and the wall time of the first pass after startup
(`first_pass_s`, the base model's warm-up: what vLLM builds at its first sampling, every
experiment's first rollouts wait for) beside the base model's median pass. Each pass also
records the CPU-seconds of the API server (HTTP, chat templates, detokenizing, writing the
answers) and of its engine core: on a machine with few cores the API server's share is
time the engine and the trainer do not get.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from workbench.bench.process_trees import tree_members
from workbench.inference.token_id_logprobs import with_logprobs_as_ids
from workbench.system.procfs import all_stats, cpu_seconds
from workbench.testing.local_server import LocalServer, start_local_server, stop_local_server

BASE_MODEL = "builtin:tiny-reverse"
LORA_RANK = 8
LORA_ALPHA = 16
MAX_LORAS = 8
ADAPTER_COUNTS = (1, 2, 4, 8)
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STARTUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Workload:
    """What one measured pass sends: `prompts` requests of `completions_per_prompt` each."""

    prompts: int
    completions_per_prompt: int
    max_tokens: int
    repetitions: int
    seed: int = 0
    temperature: float = 1.0

    @property
    def completion_tokens(self) -> int:
        return self.prompts * self.completions_per_prompt * self.max_tokens


# The full workload is one orchestrator step of the reverse_text recipe, twice over
# (16 prompts x 8 completions, max_tokens 64: the orchestrator's default).
FULL_WORKLOAD = Workload(prompts=16, completions_per_prompt=8, max_tokens=64, repetitions=5)
QUICK_WORKLOAD = Workload(prompts=8, completions_per_prompt=4, max_tokens=32, repetitions=3)


@dataclass
class Pass:
    """One measured pass of the workload, with the CPU-seconds the server's processes used
    in it: the API server (HTTP, templates, detokenizing, answers) and its engine."""

    wall_s: float
    completion_tokens: int
    api_server_cpu_s: float = float("nan")
    engine_cpu_s: float = float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else float("nan")


@dataclass
class Configuration:
    """Requests target the base model (`adapters == 0`) or `adapters` adapters round-robin."""

    adapters: int
    passes: list[Pass] = field(default_factory=list)
    ratio_vs_base: float = float("nan")

    @property
    def label(self) -> str:
        if self.adapters == 0:
            return "base model"
        return f"{self.adapters} adapter" + ("s" if self.adapters > 1 else "")

    @property
    def median_tokens_per_s(self) -> float:
        return statistics.median(p.tokens_per_s for p in self.passes)

    @property
    def median_wall_s(self) -> float:
        return statistics.median(p.wall_s for p in self.passes)

    @property
    def median_api_server_cpu_s(self) -> float:
        return statistics.median(p.api_server_cpu_s for p in self.passes)

    @property
    def median_engine_cpu_s(self) -> float:
        return statistics.median(p.engine_cpu_s for p in self.passes)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "adapters": self.adapters,
            "median_tokens_per_s": round(self.median_tokens_per_s, 1),
            "ratio_vs_base": round(self.ratio_vs_base, 3),
            "median_wall_s": round(self.median_wall_s, 3),
            "median_api_server_cpu_s": round(self.median_api_server_cpu_s, 3),
            "median_engine_cpu_s": round(self.median_engine_cpu_s, 3),
            "passes": [
                {**asdict(p), "tokens_per_s": round(p.tokens_per_s, 1)} for p in self.passes
            ],
        }


# ---------------------------------------------------------------------------- the server


def start_server(scratch: Path) -> LocalServer:
    """Start vLLM as the supervisor does and wait for its health endpoint."""
    return start_local_server(
        scratch,
        BASE_MODEL,
        max_loras=MAX_LORAS,
        max_lora_rank=LORA_RANK,
        timeout_s=STARTUP_TIMEOUT_S,
    )


# ---------------------------------------------------------------------------- adapters


def lora_target_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of every linear layer an adapter targets, by module name."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return {
        name: (module.in_features, module.out_features)
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] in TARGET_MODULES
    }


def write_random_adapter(
    shapes: dict[str, tuple[int, int]], model_dir: Path, directory: Path, seed: int
) -> Path:
    """A random rank-8 adapter on every targeted layer; its values do not matter for speed
    (completions are forced to full length)."""
    import torch

    from workbench.trainer.runs.broadcast import write_adapter

    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, (in_features, out_features) in shapes.items():
        state[f"{name}.lora_A.weight"] = (
            torch.randn(LORA_RANK, in_features, generator=generator) * 0.1
        )
        state[f"{name}.lora_B.weight"] = (
            torch.randn(out_features, LORA_RANK, generator=generator) * 0.1
        )
    return write_adapter(
        directory,
        state,
        rank=LORA_RANK,
        alpha=LORA_ALPHA,
        target_modules=TARGET_MODULES,
        base_model=str(model_dir),
    )


# ---------------------------------------------------------------------------- the workload


def benchmark_prompts(workload: Workload) -> list[list[dict[str, str]]]:
    """The chats of the reverse_text environment's first prompts for the workload's seed."""
    from workbench.envs import get_environment

    env = get_environment("reverse_text")
    return [p.messages for p in env.sample_prompts(workload.prompts, seed=workload.seed)]


def request_body(
    messages: list[dict[str, str]], model: str, workload: Workload, seed: int
) -> dict[str, Any]:
    """The orchestrator's request (see `InferenceClient.chat`) plus `ignore_eos`."""
    return with_logprobs_as_ids(
        {
            "model": model,
            "messages": messages,
            "n": workload.completions_per_prompt,
            "max_tokens": workload.max_tokens,
            "temperature": workload.temperature,
            "top_p": 1.0,
            "seed": seed,
            "logprobs": True,
            "return_token_ids": True,
            "ignore_eos": True,
        }
    )


def run_pass(
    http: httpx.Client,
    server: LocalServer,
    chats: list[list[dict[str, str]]],
    models: list[str],
    workload: Workload,
) -> Pass:
    """Send one request per prompt, all at once, request i to `models[i % len(models)]`."""
    url = f"{server.endpoint.server_url}/v1/chat/completions"

    def one(index: int) -> int:
        body = request_body(
            chats[index], models[index % len(models)], workload, seed=workload.seed + index
        )
        response = http.post(url, json=body)
        if response.status_code != 200:
            raise RuntimeError(
                f"{body['model']}: the server answered {response.status_code}: "
                f"{response.text[:300]}"
            )
        return int(response.json()["usage"]["completion_tokens"])

    api_server = server.process.pid
    api_before, engine_before = cpu_seconds(api_server), descendants_cpu_s(api_server)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(chats)) as pool:
        tokens = sum(pool.map(one, range(len(chats))))
    return Pass(
        wall_s=time.monotonic() - started,
        completion_tokens=tokens,
        api_server_cpu_s=round(cpu_seconds(api_server) - api_before, 3),
        engine_cpu_s=round(descendants_cpu_s(api_server) - engine_before, 3),
    )


def descendants_cpu_s(pid: int) -> float:
    """The CPU-seconds of `pid`'s descendants (vLLM's engine core and its helpers; the
    launcher execs the API server, so `pid` is the API server itself)."""
    descendants = tree_members(pid, all_stats() or [])[1:]  # the first member is `pid`
    return sum(stat.cpu_seconds for stat in descendants)


# ---------------------------------------------------------------------------- the benchmark


def run_inference_benchmark(quick: bool = False) -> dict[str, Any]:
    """Measure, write `benchmarks/results/inference-*.json`, print a table; return the report
    (with a `summary` list of {metric, value} rows for `bench all`)."""
    from workbench.bench.results import write_result
    from workbench.models.resolve import resolve_model

    workload = QUICK_WORKLOAD if quick else FULL_WORKLOAD
    load_before = os.getloadavg()
    model_dir = resolve_model(BASE_MODEL)  # builds the model on first use: not timed
    chats = benchmark_prompts(workload)

    with tempfile.TemporaryDirectory(prefix="workbench-bench-inference-") as scratch_name:
        scratch = Path(scratch_name)
        shapes = lora_target_shapes(model_dir)
        adapter_dirs = [
            write_random_adapter(shapes, model_dir, scratch / "adapters" / f"adapter_{i}", seed=i)
            for i in range(MAX_LORAS)
        ]
        server = start_server(scratch)
        try:
            configurations, adapter_load_s, first_pass = _measure(
                server, adapter_dirs, chats, workload
            )
        finally:
            stop_local_server(server.process)

    base = configurations[0]
    for configuration in configurations:
        configuration.ratio_vs_base = configuration.median_tokens_per_s / base.median_tokens_per_s
    report: dict[str, Any] = {
        "model": BASE_MODEL,
        "dtype": "float32",
        "lora_rank": LORA_RANK,
        "max_loras": MAX_LORAS,
        "workload": {
            **asdict(workload),
            "env": "reverse_text",
            "ignore_eos": True,
            "completion_tokens_per_pass": workload.completion_tokens,
        },
        "server_startup_s": round(server.startup_s, 2),
        "adapter_load_s_median": round(statistics.median(adapter_load_s), 3),
        "first_pass_s": round(first_pass.wall_s, 2),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "configurations": [c.to_json() for c in configurations],
    }
    report["summary"] = summary_rows(report)
    report["path"] = str(write_result("inference", report))
    print_table(report)
    return report


def _measure(
    server: LocalServer,
    adapter_dirs: list[Path],
    chats: list[list[dict[str, str]]],
    workload: Workload,
) -> tuple[list[Configuration], list[float], Pass]:
    """The configurations' passes, each adapter's load time and the first pass (untimed in
    the configurations: a warm-up)."""
    adapter_names = [f"bench_adapter_{i}" for i in range(len(adapter_dirs))]
    configurations = [Configuration(adapters=0)] + [Configuration(n) for n in ADAPTER_COUNTS]
    with httpx.Client(
        headers={"Authorization": f"Bearer {server.endpoint.api_key}"},
        timeout=httpx.Timeout(600.0, connect=10.0),
        limits=httpx.Limits(max_connections=len(chats) + 4),
    ) as http:
        adapter_load_s = []
        for name, path in zip(adapter_names, adapter_dirs, strict=True):
            started = time.monotonic()
            response = http.post(
                f"{server.endpoint.server_url}/v1/load_lora_adapter",
                json={"lora_name": name, "lora_path": str(path)},
            )
            if response.status_code != 200:
                raise RuntimeError(f"loading {name} failed: {response.text[:300]}")
            adapter_load_s.append(time.monotonic() - started)

        def models_for(configuration: Configuration) -> list[str]:
            return adapter_names[: configuration.adapters] or [BASE_MODEL]

        warm_ups = [  # untimed in the configurations
            run_pass(http, server, chats, models_for(configuration), workload)
            for configuration in configurations
        ]
        for _ in range(workload.repetitions):
            for configuration in configurations:
                configuration.passes.append(
                    run_pass(http, server, chats, models_for(configuration), workload)
                )
    return configurations, adapter_load_s, warm_ups[0]


def summary_rows(report: dict[str, Any]) -> list[dict[str, str]]:
    rows = [
        {"metric": "inference: server startup", "value": f"{report['server_startup_s']:.1f} s"},
        {
            "metric": "inference: first pass after startup",
            "value": f"{report['first_pass_s']:.2f} s",
        },
    ]
    for configuration in report["configurations"]:
        value = f"{configuration['median_tokens_per_s']:.0f} tok/s"
        if configuration["adapters"]:
            value += f" ({configuration['ratio_vs_base']:.2f}x base)"
        value += f", API server {configuration['median_api_server_cpu_s']:.2f} CPU-s a pass"
        rows.append({"metric": f"inference: {configuration['label']}", "value": value})
    return rows


def print_table(report: dict[str, Any]) -> None:
    from rich.table import Table

    from workbench.system.console import output_console

    workload = report["workload"]
    table = Table(
        title=(
            f"vLLM inference, {report['model']} ({report['dtype']}), LoRA rank "
            f"{report['lora_rank']}: {workload['prompts']} prompts x {workload['completions_per_prompt']}"
            f" completions x {workload['max_tokens']} tokens, median of {workload['repetitions']}"
        )
    )
    table.add_column("requests target")
    table.add_column("completion tokens/s", justify="right")
    table.add_column("vs base", justify="right")
    table.add_column("median wall s", justify="right")
    table.add_column("API server CPU-s", justify="right")
    table.add_column("engine CPU-s", justify="right")
    for configuration in report["configurations"]:
        table.add_row(
            configuration["label"],
            f"{configuration['median_tokens_per_s']:.0f}",
            f"{configuration['ratio_vs_base']:.2f}x",
            f"{configuration['median_wall_s']:.2f}",
            f"{configuration['median_api_server_cpu_s']:.2f}",
            f"{configuration['median_engine_cpu_s']:.2f}",
        )
    console = output_console()  # tables whole when piped or logged
    console.print(table)
    console.print(
        f"server startup {report['server_startup_s']:.1f} s, adapter load "
        f"{report['adapter_load_s_median']:.2f} s (median), first pass "
        f"{report['first_pass_s']:.2f} s, load average "
        f"{report['load_average_before'][0]:.2f} before / {report['load_average_after'][0]:.2f} after",
        highlight=False,
    )
