"""Episodes: the completions of one step as token sequences the trainer can train on exactly.

A single-turn episode is one chat completion: the prompt's tokens as vLLM rendered them,
then the tokens it sampled with their log-probs. A multi-turn episode
(`MultiTurnEnvironment`) goes on: after each model reply the environment answers, its
message is appended as tokens, and the model continues from the whole token sequence.

No re-tokenisation drift, by construction: the model's tokens are never rebuilt from text.
Each later turn is a `/v1/completions` request whose prompt is the episode's token ids so far
(the sampled ids kept as sampled), so the log-probs vLLM returns are for exactly the tokens
the trainer will score. Only the environment's message is tokenised, by the server's own
chat template (`TurnJoiner`): the tokens that close an assistant turn (its end-of-turn
marker, unless the model sampled it) and those that open the environment's message and the
next assistant turn. These carry no loss (`mask` False, log-prob 0); the model's own tokens
carry it. Advantages are per episode, over the group of one prompt's episodes.

An environment that runs its episodes itself (`ExternalEpisodes`: a verifiers environment,
in a process of its own) is handed the prompts, the server's endpoint and the sampling, and
returns the episodes whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from workbench.config import SamplingParams
from workbench.envs.base import Environment, Message, Prompt
from workbench.envs.episode import Episode
from workbench.envs.external import ExternalEpisodes
from workbench.envs.multi_turn import MultiTurnEnvironment
from workbench.files.endpoint import Endpoint
from workbench.inference.client import ChatResult, Completion, InferenceError
from workbench.orchestrator.generation import MAX_REQUESTS_IN_FLIGHT, complete_prompts

logger = logging.getLogger(__name__)

# Stands for an assistant reply while the template's tokens around a reply are measured;
# plain letters, so no tokenizer merges it with the template's markers.
_PLACEHOLDER = "placeholder"


class MultiTurnTemplateError(RuntimeError):
    """The base model's chat template cannot be continued token by token; says why."""


class EpisodeClient(Protocol):
    """What episodes need from the inference server (`InferenceClient` is the real one)."""

    endpoint: Endpoint  # where an `ExternalEpisodes` environment sends its requests

    def chat(self, messages, *, model, n, sampling, seed) -> ChatResult: ...

    def complete_tokens(self, prompt_ids, *, model, sampling, seed) -> Completion: ...

    def tokenize_chat(self, messages, *, add_generation_prompt) -> list[int]: ...

    def tokenize_text(self, text: str) -> list[int]: ...


class TurnJoiner:
    """The tokens between a model reply and the model's next turn, from the server's chat
    template: what closes the reply, the environment's message, what opens the next reply.

    The template must only append: a conversation one message longer renders as the shorter
    one's tokens followed by more. Templates that re-render earlier turns are refused with
    `MultiTurnTemplateError` rather than trained on tokens the model never saw.
    """

    def __init__(self, client: EpisodeClient) -> None:
        self.client = client
        self._closing: list[int] | None = None

    def closing(self) -> list[int]:
        """The tokens the template writes after an assistant reply's content."""
        if self._closing is None:
            chat = [{"role": "user", "content": "x"}]
            opened = self.client.tokenize_chat(chat, add_generation_prompt=True)
            closed = self.client.tokenize_chat(
                [*chat, {"role": "assistant", "content": _PLACEHOLDER}],
                add_generation_prompt=False,
            )
            content = self.client.tokenize_text(_PLACEHOLDER)
            end = len(opened) + len(content)
            if closed[: len(opened)] != opened or closed[len(opened) : end] != content:
                raise MultiTurnTemplateError(
                    "the base model's chat template does not render an assistant reply as its "
                    "generation prompt followed by the reply's own tokens, so a multi-turn "
                    "episode cannot be continued token by token"
                )
            self._closing = closed[end:]
        return self._closing

    def between(self, chat: list[Message], message: str, reply_ended: int | None) -> list[int]:
        """The tokens after a reply whose last sampled token is `reply_ended`, up to the next
        reply: the rest of the reply's closing, then the environment's `message` and the next
        assistant turn's opening. `chat` is the conversation so far, ending with the reply."""
        closing = self.closing()
        before = self.client.tokenize_chat(chat, add_generation_prompt=False)
        after = self.client.tokenize_chat(
            [*chat, {"role": "user", "content": message}], add_generation_prompt=True
        )
        if after[: len(before)] != before:
            raise MultiTurnTemplateError(
                "the base model's chat template renders earlier turns differently once a "
                "message follows them, so the tokens the model saw would not be the tokens "
                "trained on; multi-turn episodes need a template that only appends"
            )
        # The model may have sampled the closing's first token (its end-of-turn marker): it
        # is then already in the episode, as the model's own token.
        sampled_close = bool(closing) and reply_ended == closing[0]
        return closing[1 if sampled_close else 0 :] + after[len(before) :]


def run_episodes(
    client: EpisodeClient,
    env: Environment,
    prompts: list[Prompt],
    seeds: list[int],
    *,
    model: str,
    n: int,
    sampling: SamplingParams,
    joiner: TurnJoiner | None = None,
) -> list[list[Episode]]:
    """`n` scored episodes of each prompt, in the prompts' order. The first turn of every
    episode of a prompt is one chat request (vLLM samples the `n` together); a multi-turn
    environment's later turns are one request per episode, all in flight at once."""
    if isinstance(env, ExternalEpisodes):
        return env.run_episodes(
            client.endpoint, prompts, seeds, model=model, n=n, sampling=sampling
        )
    results = complete_prompts(client, prompts, seeds, model=model, n=n, sampling=sampling)
    groups = []
    for result in results:
        group = []
        for completion in result.completions:
            episode = Episode(prompt_ids=list(result.prompt_token_ids))
            episode.add_model_turn(completion)
            group.append(episode)
        groups.append(group)
    if isinstance(env, MultiTurnEnvironment):
        _continue_episodes(
            client,
            env,
            prompts,
            seeds,
            groups,
            joiner or TurnJoiner(client),
            lambda ids, seed: client.complete_tokens(
                ids, model=model, sampling=sampling, seed=seed
            ),
        )
    for prompt, group in zip(prompts, groups, strict=True):
        for episode in group:
            if isinstance(env, MultiTurnEnvironment):
                episode.reward = env.clamped_episode_reward(prompt, episode.replies)
            else:
                episode.reward = env.reward(prompt, episode.replies[0])
    return groups


def _continue_episodes(
    client: EpisodeClient,
    env: MultiTurnEnvironment,
    prompts: list[Prompt],
    seeds: list[int],
    groups: list[list[Episode]],
    joiner: TurnJoiner,
    complete: Callable[[list[int], int], Completion],
) -> None:
    def next_turn(item: tuple[Prompt, int, int, Episode]) -> None:
        prompt, seed, number, episode = item
        message = env.respond(prompt, episode.replies)
        if message is None:
            episode.done = True
            return
        last = episode.token_ids[-1] if episode.token_ids else None
        tail = joiner.between(episode.chat(prompt), message, last)
        episode.add_env_turn(message, tail)
        # Each turn of each episode samples with a seed of its own, fixed by the prompt's.
        turn_seed = (seed * 1_000_003 + number * 101 + len(episode.replies)) % 2**31
        try:
            reply = complete(episode.prompt_ids + episode.token_ids, turn_seed)
        except InferenceError as err:
            # Most often the episode outgrew the server's max_model_len: it ends here,
            # counted as truncated, and keeps the turns it had.
            logger.warning("episode ends early: %s", err)
            episode.truncated = episode.done = True
            return
        episode.add_model_turn(reply)

    joiner.closing()  # measured once, before the threads need it
    pool = ThreadPoolExecutor(max_workers=MAX_REQUESTS_IN_FLIGHT)
    try:
        for _ in range(env.max_turns - 1):
            live = [
                (prompt, seed, number, episode)
                for prompt, seed, group in zip(prompts, seeds, groups, strict=True)
                for number, episode in enumerate(group)
                if not episode.done
            ]
            if not live:
                break
            list(pool.map(next_turn, live))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
