"""`workbench bench eval --verifiers`: episodes per second of a verifiers environment beside
the built-in one, on one vLLM server in one sitting.

The same task both ways: the recipe's run config (its batch, sampling and eval) on its own
environment, then on `verifiers:vf_reverse_text` (the shipped taskset in
recipes/verifiers_tasks/, the recipe's text lengths) with verifiers' episodes run in the
environment's process (`workbench-chat`, the default), and with verifiers' `null` harness,
which starts a program per episode (how every verifiers episode ran before). Each is timed
on a training step's generation (`run_episodes`, as the orchestrator calls it) and on an
eval; medians of alternating repetitions, and episodes per second of each.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from workbench.config import OrchestratorConfig

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "verifiers_tasks"
TASKSET = "verifiers:vf_reverse_text"
# Each `null` episode starts a python that imports openai and mcp: seconds of CPU each, so
# it is measured fewer times.
SLOW_HARNESS_REPETITIONS = 1
PROGRAMS_AT_ONCE = 32


def verifiers_config(config: OrchestratorConfig, harness: str | None) -> OrchestratorConfig:
    """`config` on the verifiers taskset: the same batch, sampling and eval, the built-in
    environment's text lengths."""
    lengths = {
        key: config.env_args[key] for key in ("min_length", "max_length") if key in config.env_args
    }
    eval_prompts = max(config.eval.num_prompts, 1)
    env_args: dict[str, Any] = {
        "path": str(TASKS),
        "taskset": {"num_tasks": 2000, **lengths},
        "eval_taskset": {"seed": 1, "num_tasks": eval_prompts},
    }
    if harness is not None:
        env_args["harness"] = harness
    if harness == "null":
        # A program per episode: at most as many at once as before (not a step's 128).
        env_args["max_concurrent"] = PROGRAMS_AT_ONCE
    return config.model_copy(update={"env": TASKSET, "env_args": env_args})


def measure_environments(
    endpoint: Any,
    adapter: Path,
    run: Path,
    config: OrchestratorConfig,
    repetitions: int,
) -> dict[str, dict[str, Any]]:
    """For the built-in environment and the verifiers taskset (both harnesses): the step's
    and the eval's seconds (each repetition), their medians and episodes per second."""
    slow = min(repetitions, SLOW_HARNESS_REPETITIONS)
    cases = {
        config.env: (config, repetitions, True),
        f"{TASKSET} (workbench-chat)": (verifiers_config(config, None), repetitions, True),
        # Minutes a step: its first step is timed too (seconds of warming up are noise).
        f"{TASKSET} (null: a program per episode)": (verifiers_config(config, "null"), slow, False),
    }
    return {
        name: _measure_one(endpoint, adapter, run / f"case{number}", case_config, times, warm)
        for number, (name, (case_config, times, warm)) in enumerate(cases.items())
    }


def _measure_one(
    endpoint: Any,
    adapter: Path,
    run: Path,
    config: OrchestratorConfig,
    repetitions: int,
    warm_up: bool = True,
) -> dict[str, Any]:
    from workbench.envs import get_environment
    from workbench.inference.client import AdapterVersions, InferenceClient
    from workbench.orchestrator.episodes import run_episodes
    from workbench.orchestrator.evaluation import PolicyEvaluator

    run.mkdir(parents=True)
    env = get_environment(config.env, **config.env_args)
    prompts = env.sample_prompts(config.prompts_per_step, seed=config.seed)
    step_episodes = len(prompts) * config.rollouts_per_prompt
    seconds: dict[str, list[float]] = {"step": [], "eval": []}
    try:
        with InferenceClient(endpoint) as client:
            adapters = AdapterVersions(client, run.name)
            adapters.load(1, adapter)
            model = adapters.model_for_requests()
            evaluator = PolicyEvaluator(run, config, env, client, adapters)
            eval_episodes = len(evaluator.prompts) * config.eval.rollouts_per_prompt

            def step() -> float:
                started = time.monotonic()
                run_episodes(
                    client,
                    env,
                    prompts,
                    list(range(len(prompts))),
                    model=model,
                    n=config.rollouts_per_prompt,
                    sampling=config.sampling.params(),
                )
                return time.monotonic() - started

            if warm_up:
                step()  # the first requests of a shape are slower
            for _ in range(repetitions):
                seconds["step"].append(step())
                seconds["eval"].append(evaluator.score(model).seconds)
            adapters.unload_all()
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    return {
        "step_episodes": step_episodes,
        "eval_episodes": eval_episodes,
        "seconds": {name: [round(v, 3) for v in values] for name, values in seconds.items()},
        "medians_s": {name: round(value, 3) for name, value in medians.items()},
        "episodes_per_s": {
            "step": round(step_episodes / medians["step"], 1),
            "eval": round(eval_episodes / medians["eval"], 1),
        },
    }


def summary_rows(cases: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """Episodes per second of each case, and each verifiers case's times over the built-in's."""
    (builtin, *_) = cases.values()
    rows = []
    for name, case in cases.items():
        ratio = ""
        if case is not builtin:
            step = case["medians_s"]["step"] / builtin["medians_s"]["step"]
            evaluation = case["medians_s"]["eval"] / builtin["medians_s"]["eval"]
            ratio = f"; {step:.2f}x the built-in step's time, {evaluation:.2f}x its eval's"
        rows.append(
            {
                "metric": f"{name}: episodes/s, step ({case['step_episodes']}) / eval "
                f"({case['eval_episodes']})",
                "value": f"{case['episodes_per_s']['step']} / {case['episodes_per_s']['eval']}"
                f"{ratio}",
            }
        )
    return rows
