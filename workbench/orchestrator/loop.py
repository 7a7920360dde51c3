"""One run's orchestrator loop: prompts -> completions -> rewards -> advantages -> batch.

Each iteration:
1. stop if the run is evicted (`control/evicted.txt`), with its reason;
2. load the newest STABLE `broadcast/step_N` into vLLM under a fresh name, and wait while
   this step would be more than `async_level` steps ahead of the loaded adapter;
3. take the next prompts of the environment's stream and ask for `rollouts_per_prompt`
   completions of each (token ids and log-probs) with the run's adapter;
4. score them, compute GRPO advantages; a batch without learning signal is dropped and
   retried with new prompts, and three in a row evict the run;
5. write `rollouts/step_N` atomically, record the step's text for the rollout browser
   (`samples`), append a metrics line, checkpoint its state.
Between 2 and 3, when the loaded policy version is due for evaluation (`eval.interval`), an
eval of it starts in the background (`evaluation`). At `max_steps` it waits for the
trainer's last adapter, evaluates it, marks the run finished and exits.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from workbench.config import OrchestratorConfig
from workbench.envs import get_environment
from workbench.envs.base import Environment, Prompt
from workbench.envs.episode import Episode
from workbench.envs.external import ExternalEpisodeError
from workbench.files import busy, layout, run_control
from workbench.files.metrics import append_metrics
from workbench.files.rollouts import RolloutBatch, Sample, write_rollouts
from workbench.files.samples import SampledCompletion, SampleGroup, StepSamples
from workbench.files.samples import record_step as record_samples
from workbench.inference.client import AdapterVersions, NonFiniteSamples
from workbench.orchestrator.advantages import (
    compute_advantages,
    has_learning_signal,
    steps_ahead_allowed,
)
from workbench.orchestrator.episodes import EpisodeClient, TurnJoiner, run_episodes
from workbench.orchestrator.evaluation import PolicyEvaluator
from workbench.orchestrator.state import OrchestratorState, resume_state, save_state

logger = logging.getLogger(__name__)

MAX_EMPTY_BATCH_ATTEMPTS = 3


class RunEvicted(RuntimeError):
    """The run was evicted; the message is the reason."""


@dataclass
class StepResult:
    step: int
    written: bool
    reward_mean: float


class Orchestrator:
    def __init__(
        self,
        run: Path,
        config: OrchestratorConfig,
        client: EpisodeClient,
        adapters: AdapterVersions,
        *,
        poll_s: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
        env: Environment | None = None,
    ):
        """`env`: the run's environment, already built from `config` (see
        `preflight.checked_environment`); None: built here."""
        self.run = run
        self.run_id = run.name
        self.config = config
        self.client = client
        self.adapters = adapters
        self.poll_s = poll_s
        self.sleep = sleep
        self.env = env if env is not None else get_environment(config.env, **config.env_args)
        self.dataset = self.env.dataset(seed=config.seed, split="train")
        self.state = self._resume()
        self.first_version = first_policy_version(run, config)
        self.rng = self.state.rng(config.seed)
        self.joiner = TurnJoiner(client)  # measures the chat template once, if ever needed
        self.evaluator = PolicyEvaluator(run, config, self.env, client, adapters, self.joiner)

    # ------------------------------------------------------------------ lifecycle

    def _resume(self) -> OrchestratorState:
        state, note = resume_state(self.run, self.config.prompts_per_step)
        if note:
            logger.warning("%s %s", self.run_id, note)
        if state.step:
            logger.info(
                "%s resumes at step %d (data position %d)",
                self.run_id,
                state.step,
                state.data_position,
            )
        return state

    def run_until_done(self) -> None:
        """Loop until `max_steps` (then mark the run finished) or eviction (raises RunEvicted)."""
        busy.ready("scoring and writing")  # rewards, advantages, rollouts, metrics
        while self.state.step < self.config.max_steps:
            self.step_once()
        with busy.waiting_for("adapter"):
            self._wait_for_final_adapter()
        if self.evaluator.enabled:
            self._load_newest_adapter()
            self.evaluator.start_if_due(last=True)
            with busy.waiting_for("eval"):
                self.evaluator.wait()
        run_control.mark_finished(self.run, self.config.max_steps)
        logger.info("%s finished %d steps", self.run_id, self.config.max_steps)

    def check_evicted(self) -> None:
        eviction = run_control.read_eviction(self.run)
        if eviction is not None:
            raise RunEvicted(eviction.reason)

    # ------------------------------------------------------------------ one step

    def step_once(self) -> StepResult:
        self.check_evicted()
        step = self.state.step
        with busy.waiting_for("adapter"):
            wait_s = self._wait_for_policy(step)
        with busy.waiting_for("eval"):  # the previous eval, if still running
            eval_wait_s = self.evaluator.start_if_due()
        prompts = self.dataset.take(self.state.data_position, self.config.prompts_per_step)
        self.state.data_position += len(prompts)
        started = time.monotonic()
        model = self.adapters.model_for_requests()
        with busy.doing(busy.GENERATION):
            groups = self._generate(prompts, model)
        generation_s = time.monotonic() - started
        prompts, groups, dropped = self._kept_groups(step, prompts, groups)

        samples, rewards, lengths, truncated = _samples_of(groups)
        advantages = compute_advantages(
            rewards, [len(group) for group in groups], self.config.advantage
        )
        for sample, advantage in zip(samples, advantages, strict=True):
            sample.advantage = advantage

        written = self._write_step(step, prompts, groups, samples, advantages)
        reward_mean = statistics.fmean(rewards)
        record = append_metrics(
            self.run,
            "orchestrator",
            step,
            reward_mean=reward_mean,
            reward_std=statistics.pstdev(rewards),
            reward_min=min(rewards),
            reward_max=max(rewards),
            completion_len_mean=statistics.fmean(lengths),
            truncated_frac=truncated / len(lengths),
            generation_s=round(generation_s, 3),
            wait_s=round(wait_s, 3),
            eval_wait_s=round(eval_wait_s, 3),
            policy_version=self._policy_version(),
            written=written,
            dropped_episodes=dropped,
        )
        log_step(self.run_id, record, self.state.empty_batches)
        self.state.remember_rng(self.rng)
        save_state(self.run, self.state)
        if self.state.empty_batches >= MAX_EMPTY_BATCH_ATTEMPTS:
            self._evict_without_signal(step)
        return StepResult(step=step, written=written, reward_mean=reward_mean)

    def _write_step(
        self,
        step: int,
        prompts: list[Prompt],
        groups: list[list[Episode]],
        samples: list[Sample],
        advantages: list[float],
    ) -> bool:
        """Record the step's samples and, when some advantage is not 0, write its rollouts
        for the trainer and move to the next step; whether they were written."""
        written = has_learning_signal(advantages)
        record_samples(
            self.run,
            StepSamples(
                step=step,
                policy_version=self._policy_version(),
                written=written,
                groups=_sample_groups(prompts, groups, advantages),
            ),
        )
        if written:
            self.state.empty_batches = 0
            batch = RolloutBatch(self.run_id, step, self._policy_version(), samples)
            write_rollouts(self.run, batch)
            self.state.step += 1
        else:
            self.state.empty_batches += 1
        return written

    def _evict_without_signal(self, step: int) -> None:
        reason = (
            f"no learning signal: all advantages were zero in {MAX_EMPTY_BATCH_ATTEMPTS} "
            f"consecutive batches at step {step} (every completion of a prompt got the same "
            "reward); raise sampling.temperature or change the environment's difficulty"
        )
        self._stop(reason)

    def _generate(self, prompts: list[Prompt], model: str) -> list[list[Episode]]:
        try:
            return run_episodes(
                self.client,
                self.env,
                prompts,
                [self.rng.randrange(2**31) for _ in prompts],
                model=model,
                n=self.config.rollouts_per_prompt,
                sampling=self.config.sampling.params(),
                joiner=self.joiner,
            )
        except ExternalEpisodeError as err:  # every episode failed: its harness is broken
            self._stop(f"every episode of a step failed: {err}")
        except NonFiniteSamples:
            # Restarting would sample the same seeds with the same adapter: a crash loop.
            version = self._policy_version()
            self._stop(
                f"{run_control.DIVERGED_PREFIX} vLLM's samples of policy version {version} "
                "hold non-finite log-probs (the model's numbers overflow with this adapter); "
                "restart from an earlier checkpoint with a lower lr "
                f"(`workbench runs fork {self.run_id}@STEP NEW_ID --set lr=...`)"
            )

    def _kept_groups(
        self, step: int, prompts: list[Prompt], groups: list[list[Episode]]
    ) -> tuple[list[Prompt], list[list[Episode]], int]:
        """The step's prompts and groups without the groups left with fewer than two
        episodes (an environment that runs its own episodes drops a failed one: a group of
        one has no baseline), and how many episodes the step lost in all."""
        kept = [(p, g) for p, g in zip(prompts, groups, strict=True) if len(g) >= 2]
        expected = len(prompts) * self.config.rollouts_per_prompt
        dropped = expected - sum(len(group) for _, group in kept)
        if dropped:
            logger.warning(
                "%s step %d: %d of %d episodes failed or were left alone in their group, "
                "dropped (the environment's log says why)",
                self.run_id,
                step,
                dropped,
                expected,
            )
        if not kept:
            self._stop(f"no prompt of step {step} kept two episodes ({dropped} dropped)")
        return [p for p, _ in kept], [g for _, g in kept], dropped

    def _stop(self, reason: str) -> NoReturn:
        run_control.write_eviction(self.run, reason, by="orchestrator")
        raise RunEvicted(reason)

    # ------------------------------------------------------------------ policy versions

    def _policy_version(self) -> int:
        return self.adapters.current_step or 0

    def _load_newest_adapter(self) -> None:
        newest = layout.latest_stable_step(layout.broadcasts_dir(self.run))
        current = self.adapters.current_step
        # `broadcast/step_0` exists only for a run started from an adapter (lora.init_from).
        if newest is not None and (current is None or newest > current):
            with busy.doing("loading adapter"):
                self.adapters.load(newest, layout.broadcast_dir(self.run, newest))
            # Not at INFO: the next step line names the policy version it generated with.
            logger.debug("%s loaded adapter step %d", self.run_id, newest)

    def _wait_for_policy(self, step: int) -> float:
        """Load the newest adapter; block while `step` would be too far ahead of it."""
        started = time.monotonic()
        self._load_newest_adapter()
        while not self._may_generate(step):
            self.check_evicted()
            self.sleep(self.poll_s)
            self._load_newest_adapter()
        return time.monotonic() - started

    def _may_generate(self, step: int) -> bool:
        if self.first_version is not None and (
            self.adapters.current_step is None or self.adapters.current_step < self.first_version
        ):
            # The run's policy starts from an adapter the trainer has yet to publish (see
            # `first_policy_version`): the base model, or an older adapter, is not this
            # run's policy, whatever `async_level` would allow.
            return False
        return steps_ahead_allowed(step, self._policy_version(), self.config.async_level)

    def _wait_for_final_adapter(self) -> None:
        final = layout.broadcast_dir(self.run, self.config.max_steps)
        while not layout.is_stable(final):
            self.check_evicted()
            self.sleep(self.poll_s)


def first_policy_version(run: Path, config: OrchestratorConfig) -> int | None:
    """The first policy version this run may sample with, when it is not the base model
    (None: a run from scratch, whose version 0 is the base).

    A run that starts from a trainer checkpoint at step K (a fork, a copied checkpoint, a
    restart) has no version before K: the trainer restores K when it admits the run and
    publishes it as `broadcast/step_K` (`workbench.trainer.rl.trainer`). A run started from an
    adapter (`lora.init_from`) has that adapter as version 0, published the same way."""
    checkpoint = layout.latest_checkpoint_step(run, "trainer")
    if checkpoint is not None:
        return checkpoint
    return 0 if config.lora.init_from is not None else None


def log_step(run_id: str, record: dict[str, Any], empty_batches: int) -> None:
    """A step's one line in the orchestrator log, from its metrics record (the keys of
    docs/contracts.md); a batch dropped for lack of learning signal makes it a warning."""
    line = (
        f"{run_id} step {record['step']} reward {record['reward_mean']:.3f} "
        f"+- {record['reward_std']:.3f} len {record['completion_len_mean']:.1f} "
        f"truncated {record['truncated_frac']:.0%} policy {record['policy_version']} "
        f"gen {record['generation_s']:.2f}s wait {record['wait_s']:.2f}s"
    )
    if record["eval_wait_s"]:
        line += f" eval_wait {record['eval_wait_s']:.2f}s"
    if record["written"]:
        logger.info(line)
        return
    logger.warning(
        "%s dropped: every completion of every prompt scored alike (no learning signal); "
        "retrying with new prompts (%d/%d)",
        line,
        empty_batches,
        MAX_EMPTY_BATCH_ATTEMPTS,
    )


def _samples_of(
    groups: list[list[Episode]],
) -> tuple[list[Sample], list[float], list[int], int]:
    """The step's samples (advantages still 0), and its episodes' rewards, model-token
    counts and how many were truncated."""
    samples, rewards, lengths, truncated = [], [], [], 0
    for episode in (episode for group in groups for episode in group):
        rewards.append(episode.reward)
        lengths.append(episode.model_tokens)
        truncated += episode.truncated
        samples.append(
            Sample(
                prompt_ids=episode.prompt_ids,
                completion_ids=episode.token_ids,
                completion_logprobs=episode.logprobs,
                advantage=0.0,
                reward=episode.reward,
                completion_mask=episode.mask if episode.multi_turn else None,
            )
        )
    return samples, rewards, lengths, truncated


def _sample_groups(
    prompts: list[Prompt], groups: list[list[Episode]], advantages: list[float]
) -> list[SampleGroup]:
    """The step's groups as text, for the rollout browser; advantages are flat."""
    sample_groups, position = [], 0
    for prompt, group in zip(prompts, groups, strict=True):
        completions = []
        for episode in group:
            completions.append(
                SampledCompletion(
                    text=episode.transcript(),
                    reward=episode.reward,
                    advantage=advantages[position],
                    truncated=episode.truncated,
                    tokens=len(episode.token_ids),
                )
            )
            position += 1
        sample_groups.append(SampleGroup(prompt.question, prompt.answer, completions))
    return sample_groups
