"""One prompt to several runs' adapters and the base model at once, through the
experiment's vLLM while training goes on: `workbench ask` and the TUI's playground.

Each run answers with the newest of its adapter versions loaded in vLLM now (the version
its orchestrator generates with: `run_x@stepN`, listed by `GET /v1/models`); a run that
has none loaded (not training now: finished, evicted or not started) is said so, not
loaded for the occasion. The prompt goes through the run's environment as the orchestrator
sends its prompts: the environment's system prompt (if it has one) and the model's chat
template, which vLLM applies. A dataset row (a held-out prompt of the first run's
environment) can be asked instead, and its answers are then scored with the environment's
reward.

Training's share of the server: each run gets exactly one request (one sequence, the base
model one more) of at most `max_tokens` tokens (default: the run's `sampling.max_tokens`,
capped at `DEFAULT_MAX_TOKENS`), at the server's normal priority, batched by vLLM with the
runs' own requests. A step being generated meanwhile shares the batch with those few extra
sequences, as it would with one more prompt of one run: it is delayed by at most their
share of the batch, for as long as they take, and never waits for them to finish.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from workbench.config import (
    ConfigError,
    OrchestratorConfig,
    SamplingParams,
    load_orchestrator_config,
)
from workbench.envs import get_environment
from workbench.envs.base import Prompt
from workbench.files import layout
from workbench.files.endpoint import read_endpoint
from workbench.inference.client import InferenceClient, InferenceError

DEFAULT_MAX_TOKENS = 128
BASE_LABEL = "base"
_ADAPTER_NAME = re.compile(r"^(?P<run>.+)@step(?P<step>\d+)$")


class AskError(RuntimeError):
    """Nothing can be asked (no server, a run that is not there); the message says why."""


@dataclass(frozen=True)
class Settings:
    """What the user set; None: each run's own (`max_tokens` capped)."""

    max_tokens: int | None = None
    temperature: float | None = None


@dataclass
class Answer:
    label: str  # the run id, or "base"
    model: str | None  # the served name asked; None: nothing to ask
    text: str = ""
    truncated: bool = False
    reward: float | None = None  # for a dataset row only
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "model": self.model,
            "text": self.text,
            "truncated": self.truncated,
            "reward": self.reward,
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }


def newest_adapters(served: list[str]) -> dict[str, str]:
    """Each run's newest served adapter name (`run_x@step7`), by run id."""
    newest: dict[str, tuple[int, str]] = {}
    for name in served:
        match = _ADAPTER_NAME.match(name)
        if match:
            step = int(match["step"])
            if step >= newest.get(match["run"], (-1, ""))[0]:
                newest[match["run"]] = (step, name)
    return {run: name for run, (_, name) in newest.items()}


def run_configs(experiment: Path, run_ids: list[str] | None) -> dict[str, OrchestratorConfig]:
    """The runs' configs (every run of the experiment when None), by id."""
    if run_ids is None:
        run_ids = [path.name for path in layout.list_run_dirs(experiment)]
    configs = {}
    for run_id in run_ids:
        path = layout.orch_config_path(layout.run_dir(experiment, run_id))
        try:
            configs[run_id] = load_orchestrator_config(path)
        except FileNotFoundError:
            raise AskError(f"no run {run_id!r} in {experiment}") from None
        except ConfigError as err:
            raise AskError(f"{path}: {err}") from None
    return configs


def template_prompt(config: OrchestratorConfig, row: int) -> Prompt:
    """Held-out prompt `row` of the run's environment (the eval split, by its seed)."""
    env = get_environment(config.env, **config.env_args)
    return env.dataset(seed=config.seed, split="eval")[row]


def sampling_of(config: OrchestratorConfig | None, settings: Settings) -> SamplingParams:
    own = config.sampling if config is not None else None
    max_tokens = settings.max_tokens or min(
        own.max_tokens if own else DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOKENS
    )
    temperature = settings.temperature
    if temperature is None:
        temperature = own.temperature if own else 1.0
    return SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_p=own.top_p if own else 1.0
    )


def ask(
    experiment: Path,
    text: str | None,
    *,
    run_ids: list[str] | None = None,
    base: bool = True,
    settings: Settings = Settings(),
    row: int | None = None,
) -> list[Answer]:
    """Ask `text` (or held-out prompt `row`) of each run's newest adapter and the base model,
    all at once; answers in the runs' order, the base model's last."""
    endpoint = read_endpoint(experiment)
    if endpoint is None:
        raise AskError(
            f"{experiment} has no inference server (no supervisor/endpoint.json): start the "
            "experiment with `workbench up`"
        )
    configs = run_configs(experiment, run_ids)
    first = next(iter(configs.values()), None)
    dataset_row = None
    if row is not None:
        if first is None:
            raise AskError("a dataset row needs a run: its environment holds the rows")
        dataset_row = template_prompt(first, row)
    elif not text:
        raise AskError("nothing to ask: give a prompt, or a dataset row")
    with InferenceClient(endpoint, timeout_s=300.0) as client:
        try:
            served = newest_adapters(client.served_models())
        except (httpx.HTTPError, InferenceError) as err:
            raise AskError(
                f"the inference server at {endpoint.base_url} answers no: {err}"
            ) from None
        jobs = [(run_id, served.get(run_id), config) for run_id, config in configs.items()]
        if base:
            jobs.append((BASE_LABEL, endpoint.model, first))

        scorer = get_environment(first.env, **first.env_args) if dataset_row else None

        def one(job: tuple[str, str | None, OrchestratorConfig | None]) -> Answer:
            label, model, config = job
            prompt = _prompt_for(config, text, dataset_row)
            answer = _answer(client, label, model, prompt, sampling_of(config, settings))
            if scorer is not None and answer.error is None:
                answer.reward = scorer.reward(prompt, answer.text)
            return answer

        with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as pool:
            return list(pool.map(one, jobs))


def _prompt_for(
    config: OrchestratorConfig | None, text: str | None, dataset_row: Prompt | None
) -> Prompt:
    if dataset_row is not None:
        return dataset_row
    if config is None:  # the base model alone: the plain prompt
        return Prompt(env="", split="", seed=0, index=0, question=text or "", answer="")
    return replace(template_prompt(config, row=0), question=text or "", chat=None)


def _answer(
    client: InferenceClient,
    label: str,
    model: str | None,
    prompt: Prompt,
    sampling: SamplingParams,
) -> Answer:
    if model is None:
        return Answer(
            label,
            None,
            error=f"no adapter of {label} is loaded in vLLM: the run is not training now "
            "(finished, evicted, or waiting for its first adapter or a trainer slot)",
        )
    started = time.monotonic()
    for attempt in range(2):
        try:
            result = client.chat(prompt.messages, model=model, n=1, sampling=sampling, seed=0)
            break
        except (httpx.HTTPError, InferenceError) as err:
            # Its orchestrator may have loaded a newer version and unloaded this one since
            # the listing: ask the newest again, once.
            newer = newest_adapters(_listing(client)).get(label) if attempt == 0 else None
            if newer is None or newer == model:
                return Answer(label, model, error=str(err), seconds=time.monotonic() - started)
            model = newer
    completion = result.completions[0]
    return Answer(
        label,
        model,
        text=completion.text,
        truncated=completion.truncated,
        seconds=time.monotonic() - started,
    )


def _listing(client: InferenceClient) -> list[str]:
    try:
        return client.served_models()
    except (httpx.HTTPError, InferenceError):
        return []
