"""`workbench bench eval --verifiers`: episodes per second of a verifiers environment beside
the built-in one, on one vLLM server in one sitting.

The same task both ways: the recipe's run config (its batch, sampling and eval) on its own
environment, then on `verifiers:vf_reverse_text` (the shipped taskset in
recipes/verifiers_tasks/, the recipe's text lengths) with verifiers' episodes run in the
environment's process (`workbench-chat`, the default), and with verifiers' `null` harness,
which starts a program per episode (how every verifiers episode ran before). Each is timed
on a training step's generation (`run_episodes`, as the orchestrator calls it) and on an
eval, the fast cases taking turns; medians of the repetitions, episodes per second of each, and
where the CPU went (this process, vLLM's, the environment's own).
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
    server_pid: int | None = None,
) -> dict[str, dict[str, Any]]:
    """For the built-in environment and the verifiers taskset (both harnesses): the step's
    and the eval's seconds (each repetition), their medians and episodes per second, and
    the CPU seconds each took in this process, in vLLM (`server_pid` and its children) and
    in the environment's own process. The cases measured as often take turns, a step and
    an eval each, so that the machine's drift falls on them alike; the slow harness comes
    after them."""
    slow = min(repetitions, SLOW_HARNESS_REPETITIONS)
    plans = {
        config.env: (config, repetitions, True),
        f"{TASKSET} (workbench-chat)": (verifiers_config(config, None), repetitions, True),
        # Minutes a step: its first step is timed too (seconds of warming up are noise).
        f"{TASKSET} (null: a program per episode)": (verifiers_config(config, "null"), slow, False),
    }
    cases: dict[str, _Case] = {}
    try:
        for number, (name, (case_config, times, warm)) in enumerate(plans.items()):
            cases[name] = _Case(endpoint, adapter, run / f"case{number}", case_config, times)
            if warm:
                cases[name].step()  # the first requests of a shape are slower
        # The slow harness last: its programs would weigh on the cases beside it.
        taking_turns = [case for case in cases.values() if case.repetitions == repetitions]
        for _ in range(repetitions):
            for case in taking_turns:
                case.time_step_and_eval(server_pid)
        for case in cases.values():
            if case not in taking_turns:
                for _ in range(case.repetitions):
                    case.time_step_and_eval(server_pid)
        return {name: case.report() for name, case in cases.items()}
    finally:
        for case in cases.values():
            case.close()


class _Case:
    """One environment on the bench's vLLM server: its step's prompts, its evaluator, and
    what its repetitions measured."""

    def __init__(
        self, endpoint: Any, adapter: Path, run: Path, config: OrchestratorConfig, repetitions: int
    ) -> None:
        from workbench.envs import get_environment
        from workbench.inference.client import AdapterVersions, InferenceClient
        from workbench.orchestrator.evaluation import PolicyEvaluator

        run.mkdir(parents=True)
        self.config = config
        self.repetitions = repetitions
        self.env = get_environment(config.env, **config.env_args)
        self.client = InferenceClient(endpoint)
        self.adapters = AdapterVersions(self.client, run.name)
        self.adapters.load(1, adapter)
        self.model = self.adapters.model_for_requests()
        self.evaluator = PolicyEvaluator(run, config, self.env, self.client, self.adapters)
        self.prompts = self.env.sample_prompts(config.prompts_per_step, seed=config.seed)
        self.seconds: dict[str, list[float]] = {"step": [], "eval": []}
        self.cpu: dict[str, list[dict[str, float]]] = {"step": [], "eval": []}

    def step(self) -> None:
        from workbench.orchestrator.episodes import run_episodes

        run_episodes(
            self.client,
            self.env,
            self.prompts,
            list(range(len(self.prompts))),
            model=self.model,
            n=self.config.rollouts_per_prompt,
            sampling=self.config.sampling.params(),
        )

    def time_step_and_eval(self, server_pid: int | None) -> None:
        before = self._cpu_seconds(server_pid)
        started = time.monotonic()
        self.step()
        self.seconds["step"].append(time.monotonic() - started)
        between = self._cpu_seconds(server_pid)
        self.seconds["eval"].append(self.evaluator.score(self.model).seconds)
        after = self._cpu_seconds(server_pid)
        self.cpu["step"].append({who: between[who] - before[who] for who in before})
        self.cpu["eval"].append({who: after[who] - between[who] for who in before})

    def _cpu_seconds(self, server_pid: int | None) -> dict[str, float]:
        """CPU seconds so far of this process, of vLLM's processes, of the environment's."""
        seconds = {"workbench": _tree_cpu_seconds(None, children=False)}
        if server_pid is not None:
            seconds["vllm"] = _tree_cpu_seconds(server_pid)
        server = getattr(self.env, "server", None)
        if server is not None and server.process is not None:
            seconds["environment"] = _tree_cpu_seconds(server.process.pid)
        return seconds

    def report(self) -> dict[str, Any]:
        step_episodes = len(self.prompts) * self.config.rollouts_per_prompt
        eval_episodes = len(self.evaluator.prompts) * self.config.eval.rollouts_per_prompt
        medians = {name: statistics.median(values) for name, values in self.seconds.items()}
        return {
            "step_episodes": step_episodes,
            "eval_episodes": eval_episodes,
            "seconds": {
                name: [round(v, 3) for v in values] for name, values in self.seconds.items()
            },
            "medians_s": {name: round(value, 3) for name, value in medians.items()},
            "episodes_per_s": {
                "step": round(step_episodes / medians["step"], 1),
                "eval": round(eval_episodes / medians["eval"], 1),
            },
            "cpu_s_medians": {
                name: {
                    who: round(statistics.median(one[who] for one in measured), 3)
                    for who in measured[0]
                }
                for name, measured in self.cpu.items()
            },
        }

    def close(self) -> None:
        try:
            self.adapters.unload_all()
        finally:
            self.client.close()
            close = getattr(self.env, "close", None)
            if close is not None:
                close()


def _tree_cpu_seconds(pid: int | None, children: bool = True) -> float:
    """User and system CPU seconds of process `pid` (None: this one) and, with `children`,
    of every process under it, running or ended."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)] if children else [root]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
        if children:
            total += times.children_user + times.children_system
    return total


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
