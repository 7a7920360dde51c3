"""Scoring a run's policy on its environment's held-out prompts while it trains.

Every `eval.interval` policy versions (the base model, version 0, included) and at its last
version, a run's orchestrator scores the policy it has loaded on the first `eval.num_prompts`
prompts of the environment's "eval" split (never seen in training, `workbench.envs.splits`).
They are the same prompts with the same sampling seeds every time, so two versions' scores
differ by what the policy learned, not by which prompts they drew. Requests go to the run's
vLLM server under the adapter name the run generates with.

An eval runs in a background thread while the next step generates (vLLM batches both), and
holds its adapter version so that loading a newer one does not unload it mid-eval. One eval
runs at a time: when the next is due before the last has finished, the loop waits for it.
Versions the loop skips (the trainer got two ahead) are not evaluated: the first version at
or past the due one is, and its record says which.

Each eval appends one `source="eval"` line to metrics.jsonl (docs/contracts.md), and its
prompts with each completion and reward to eval_samples.jsonl (`workbench.files.eval_samples`:
what `workbench samples --compare` reads runs side by side from). The metrics lines
are also the record of what was evaluated: a restarted orchestrator reads them and next
evaluates the first due version it loads, so no version is scored twice; an eval cut short
by the restart (no line) is done again on the adapter loaded then.
"""

from __future__ import annotations

import logging
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import OrchestratorConfig
from workbench.envs.base import Environment, Prompt
from workbench.envs.episode import Episode
from workbench.files import spans
from workbench.files.eval_samples import EvalCompletion, EvalPrompt, EvalSamples, record_eval
from workbench.files.metrics import append_metrics, read_metrics
from workbench.inference.client import AdapterVersions, HeldVersion
from workbench.orchestrator.episodes import EpisodeClient, TurnJoiner, run_episodes

logger = logging.getLogger(__name__)

SOURCE = "eval"


def next_due_version(last_evaluated: int | None, interval: int) -> int:
    """The first policy version to evaluate after `last_evaluated` (None: nothing yet, so
    the very first one, the base model)."""
    if last_evaluated is None:
        return 0
    return (last_evaluated // interval + 1) * interval


def last_evaluated_version(run: Path) -> int | None:
    """The newest policy version this run has an eval record for."""
    versions = [r.get("policy_version") for r in read_metrics(run, SOURCE)]
    return max((v for v in versions if isinstance(v, int)), default=None)


@dataclass(frozen=True)
class EvalScores:
    rewards: list[float]
    completion_lengths: list[int]
    truncated: int
    seconds: float
    prompts: list[EvalPrompt] = field(default_factory=list)  # what was written, as text

    def metrics(self) -> dict[str, Any]:
        return {
            "eval_reward_mean": statistics.fmean(self.rewards),
            "eval_reward_std": statistics.pstdev(self.rewards),
            "eval_completion_len_mean": statistics.fmean(self.completion_lengths),
            "eval_truncated_frac": self.truncated / len(self.rewards),
            "eval_samples": len(self.rewards),
            "eval_s": round(self.seconds, 3),
        }


class PolicyEvaluator:
    """Starts a run's evals when they are due, one at a time, and records their scores."""

    def __init__(
        self,
        run: Path,
        config: OrchestratorConfig,
        env: Environment,
        client: EpisodeClient,
        adapters: AdapterVersions,
        joiner: TurnJoiner | None = None,
    ):
        self.run = run
        self.joiner = joiner or TurnJoiner(client)
        self.config = config.eval
        self.sampling = config.eval.sampling.params(run_max_tokens=config.sampling.max_tokens)
        self.env = env
        self.client = client
        self.adapters = adapters
        # Drawn up front, so a task space too small to hold out prompts fails at the start
        # (EnvironmentConfigError), not at the first eval.
        count = self.config.num_prompts if self.enabled else 0
        self.prompts = env.dataset(seed=config.seed, split="eval").take(0, count)
        seeds = random.Random(f"eval|{config.seed}")
        self.seeds = [seeds.randrange(2**31) for _ in self.prompts]
        # The newest version evaluated or being evaluated.
        self.last_started = last_evaluated_version(run)
        self._running: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.config.interval > 0

    def start_if_due(self, *, last: bool = False) -> float:
        """Start evaluating the loaded version if it is due (`last`: it is the run's last
        version, due unless already evaluated). Returns the seconds spent waiting for the
        previous eval to finish first."""
        if not self.enabled:
            return 0.0
        version = self.adapters.current_step or 0
        if self.last_started is not None and last:
            due = self.last_started + 1
        else:
            due = next_due_version(self.last_started, self.config.interval)
        if version < due:
            return 0.0
        waited = self.wait()
        held = self.adapters.hold_current()
        self.last_started = held.policy_version
        self._running = threading.Thread(
            target=self._evaluate, args=(held,), name=f"eval-{held.model}", daemon=True
        )
        self._running.start()
        return waited

    def wait(self) -> float:
        """Block until the running eval (if any) has recorded its scores."""
        started = time.monotonic()
        if self._running is not None:
            self._running.join()
            self._running = None
        return time.monotonic() - started

    def _evaluate(self, held: HeldVersion) -> None:
        # An eval that fails costs its record, never the run: training goes on.
        try:
            with spans.span("eval", thread="eval"):  # vLLM's work too (`workbench trace`)
                scores = self.score(held.model)
            record = append_metrics(
                self.run,
                SOURCE,
                held.policy_version,
                policy_version=held.policy_version,
                adapter=held.model,
                **scores.metrics(),
            )
            self._record_text(held, scores)
            logger.info(
                "%s eval of policy version %d (%s): reward %.3f +- %.3f over %d samples in %.1f s",
                self.run.name,
                held.policy_version,
                held.model,
                record["eval_reward_mean"],
                record["eval_reward_std"],
                record["eval_samples"],
                record["eval_s"],
            )
        except Exception as err:
            logger.warning(
                "%s eval of policy version %d failed; no record written: %s",
                self.run.name,
                held.policy_version,
                err,
            )
        finally:
            self.adapters.release(held)

    def _record_text(self, held: HeldVersion, scores: EvalScores) -> None:
        # After the metrics line, which is the record of what was evaluated: the text is
        # for reading runs side by side, and a failure to write it costs only that.
        try:
            record_eval(self.run, EvalSamples(held.policy_version, held.model, scores.prompts))
        except OSError as err:
            logger.warning("%s could not record its eval's completions: %s", self.run.name, err)

    def score(self, model: str) -> EvalScores:
        """Complete and score the eval prompts with `model` (a served adapter or the base)."""
        started = time.monotonic()
        groups = run_episodes(
            self.client,
            self.env,
            self.prompts,
            self.seeds,
            model=model,
            n=self.config.rollouts_per_prompt,
            sampling=self.sampling,
            joiner=self.joiner,
        )
        rewards, lengths, truncated = [], [], 0
        for episode in (episode for group in groups for episode in group):
            rewards.append(episode.reward)
            lengths.append(episode.model_tokens)
            truncated += episode.truncated
        return EvalScores(
            rewards,
            lengths,
            truncated,
            time.monotonic() - started,
            eval_prompts(self.prompts, groups),
        )


def eval_prompts(prompts: list[Prompt], groups: list[list[Episode]]) -> list[EvalPrompt]:
    """Each prompt with its episodes as text and rewards, as eval_samples.jsonl keeps them."""
    return [
        EvalPrompt(
            prompt.question,
            prompt.answer,
            [EvalCompletion(e.transcript(), e.reward, e.truncated) for e in group],
        )
        for prompt, group in zip(prompts, groups, strict=True)
    ]
