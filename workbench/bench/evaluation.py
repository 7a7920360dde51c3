"""`workbench bench eval`: what scoring a policy on held-out prompts costs training.

One vLLM server (as the supervisor starts it) on the recipe's base model, with one adapter
loaded whose lora_B is zero: requests take the LoRA path, and completions are the base
model's, about as long as a trained policy's (a random adapter would babble to max_tokens).
With the recipe's first run config, alternating repetitions time:
- an eval alone (`eval.num_prompts` prompts, its sampling), as the orchestrator scores one;
- a training step's generation alone (its prompts x `rollouts_per_prompt`, its sampling);
- that generation with an eval beside it, as the orchestrator runs them, and that eval.
The extra time of a step with an eval beside it is what an eval costs training; with
`eval.interval` N, one step in N pays it. Medians are reported.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from workbench.bench.env_speed import measure_environments
from workbench.bench.env_speed import summary_rows as environment_rows
from workbench.config import LORA_TARGET_MODULES, OrchestratorConfig
from workbench.recipe import Recipe, load_recipe

DEFAULT_RECIPE = Path("recipes/reverse_text.toml")
REPETITIONS = 8
QUICK_REPETITIONS = 3


def zero_adapter(model_dir: Path, directory: Path, rank: int) -> Path:
    """A rank-`rank` adapter on every targeted layer that leaves the model unchanged."""
    import torch

    from workbench.bench.inference import lora_target_shapes
    from workbench.trainer.runs.broadcast import write_adapter

    state = {}
    for name, (in_features, out_features) in lora_target_shapes(model_dir).items():
        state[f"{name}.lora_A.weight"] = torch.randn(rank, in_features) * 0.1
        state[f"{name}.lora_B.weight"] = torch.zeros(out_features, rank)
    return write_adapter(
        directory,
        state,
        rank=rank,
        alpha=2.0 * rank,
        target_modules=list(LORA_TARGET_MODULES),
        base_model=str(model_dir),
    )


def run_eval_benchmark(
    recipe: Path = DEFAULT_RECIPE, quick: bool = False, verifiers: bool = False
) -> dict[str, Any]:
    """Measure, write `benchmarks/results/eval-*.json`, print a table; return the report
    (with `summary` rows for `bench all`). `verifiers`: also episodes per second of the
    verifiers taskset beside the recipe's environment (`workbench.bench.env_speed`)."""
    from workbench.bench.results import write_result
    from workbench.models.resolve import resolve_model
    from workbench.testing.local_server import start_local_server, stop_local_server

    loaded = load_recipe(recipe)
    config = next(iter(loaded.run_configs().values()), loaded.defaults)
    model_dir = resolve_model(loaded.model.base)  # built on first use: not timed
    repetitions = QUICK_REPETITIONS if quick else REPETITIONS
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="workbench-bench-eval-") as scratch_name:
        scratch = Path(scratch_name)
        rank = loaded.inference.max_lora_rank or loaded.trainer.lora.rank
        adapter = zero_adapter(model_dir, scratch / "adapter", rank)
        server = start_local_server(
            scratch, loaded.model.base, max_loras=loaded.max_loras, max_lora_rank=rank
        )
        try:
            timings = _measure(server.endpoint, adapter, scratch / "run_bench", config, repetitions)
            environments = (
                measure_environments(
                    server.endpoint,
                    adapter,
                    scratch / "envs",
                    config,
                    repetitions,
                    server_pid=server.process.pid,
                )
                if verifiers
                else None
            )
        finally:
            stop_local_server(server.process)

    report = _report(recipe, loaded, config, repetitions, load_before, timings)
    if environments is not None:
        report["environments"] = environments
        report["summary"] += environment_rows(environments)
    report["path"] = str(write_result("eval", report))
    print_table(report)
    return report


def _report(
    recipe: Path,
    loaded: Recipe,
    config: OrchestratorConfig,
    repetitions: int,
    load_before: tuple[float, float, float],
    timings: dict[str, list[float]],
) -> dict[str, Any]:
    """The report's measurements: every timing, their medians, the load around them and
    the `bench all` summary rows."""
    medians = {name: round(statistics.median(values), 3) for name, values in timings.items()}
    report: dict[str, Any] = {
        "recipe": str(recipe),
        "model": loaded.model.base,
        "eval": config.eval.model_dump(mode="json"),
        "step": {
            "prompts": config.prompts_per_step,
            "rollouts_per_prompt": config.rollouts_per_prompt,
        },
        "repetitions": repetitions,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": {name: [round(v, 3) for v in values] for name, values in timings.items()},
        "medians_s": medians,
    }
    report["summary"] = summary_rows(medians, config)
    return report


def _measure(
    endpoint, adapter: Path, run: Path, config: OrchestratorConfig, repetitions: int
) -> dict[str, list[float]]:
    from workbench.envs import get_environment
    from workbench.inference.client import AdapterVersions, InferenceClient
    from workbench.orchestrator.evaluation import PolicyEvaluator
    from workbench.orchestrator.generation import complete_prompts

    run.mkdir(parents=True)
    env = get_environment(config.env, **config.env_args)
    prompts = env.sample_prompts(config.prompts_per_step, seed=config.seed)
    timings: dict[str, list[float]] = {
        "eval_alone": [],
        "step_generation_alone": [],
        "step_generation_with_eval": [],
        "eval_beside_step": [],
    }
    with InferenceClient(endpoint) as client:
        adapters = AdapterVersions(client, run.name)
        adapters.load(1, adapter)
        model = adapters.model_for_requests()
        evaluator = PolicyEvaluator(run, config, env, client, adapters)

        def generate_step() -> float:
            started = time.monotonic()
            complete_prompts(
                client,
                prompts,
                list(range(len(prompts))),
                model=model,
                n=config.rollouts_per_prompt,
                sampling=config.sampling.params(),
            )
            return time.monotonic() - started

        def score_into(seconds: list[float]) -> None:
            seconds.append(evaluator.score(model).seconds)

        generate_step()  # warm-up: the first requests of a shape are slower
        evaluator.score(model)
        for _ in range(repetitions):
            timings["eval_alone"].append(evaluator.score(model).seconds)
            timings["step_generation_alone"].append(generate_step())
            thread = threading.Thread(target=score_into, args=(timings["eval_beside_step"],))
            thread.start()
            timings["step_generation_with_eval"].append(generate_step())
            thread.join()
        adapters.unload_all()
    return timings


def summary_rows(medians: dict[str, float], config: OrchestratorConfig) -> list[dict[str, str]]:
    extra = medians["step_generation_with_eval"] - medians["step_generation_alone"]
    interval = config.eval.interval
    per_step = (
        f", {extra / interval:.3f} s per step at eval.interval {interval}" if interval else ""
    )
    return [
        {
            "metric": f"eval of {config.eval.num_prompts} held-out prompts alone",
            "value": f"{medians['eval_alone']:.3f} s",
        },
        {
            "metric": f"step generation ({config.prompts_per_step} x {config.rollouts_per_prompt})"
            " alone / with an eval beside it",
            "value": f"{medians['step_generation_alone']:.3f} s / "
            f"{medians['step_generation_with_eval']:.3f} s (+{extra:.3f} s{per_step})",
        },
    ]


def print_table(report: dict[str, Any]) -> None:
    from rich.table import Table

    from workbench.system.console import output_console

    table = Table(title=f"eval cost: {report['recipe']}")
    table.add_column("what")
    table.add_column("median s", justify="right")
    for name, value in report["medians_s"].items():
        table.add_row(name.replace("_", " "), f"{value:.3f}")
    console = output_console()  # tables whole when piped or logged
    console.print(table)
    for row in report["summary"]:
        console.print(f"{row['metric']}: {row['value']}", highlight=False)
