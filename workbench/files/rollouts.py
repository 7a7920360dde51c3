"""The rollout batch format: what an orchestrator writes and the trainer reads.

`run_<id>/rollouts/step_N/` holds one training batch, written whole (staged directory,
STABLE last) so the trainer never reads half a batch:

    batch.json          {"format": "workbench.rollouts", "version": 2, "run_id", "step",
                         "policy_version", "num_samples", "num_tokens", "created_at"}
    batch.safetensors   flat tensors, samples concatenated in order:
      input_ids            int64 [num_tokens]   prompt then completion tokens of each sample
      sample_lengths       int64 [num_samples]  prompt + completion tokens per sample
      prompt_lengths       int64 [num_samples]  tokens of the prompt part (no loss there)
      loss_mask            uint8 [num_tokens]   1 on the tokens the model sampled (trained),
                                                0 on prompt tokens and on tokens the
                                                environment added between turns
      inference_logprobs   float32 [num_tokens] log-prob the sampler gave each trained
                                                token (0 where loss_mask is 0)
      advantages           float32 [num_samples]
      rewards              float32 [num_samples]

A completion is everything after the prompt. In a single-turn episode all of it is the
model's; in a multi-turn one it is the model's turns with what the environment said in
between (a user or tool message rendered by the chat template), and only the model's own
tokens may carry loss. Every sample has at least one trained token.

Version 1 had no `loss_mask`: every completion token was trained. Such a batch (written
before an upgrade) is still read, its mask derived from `prompt_lengths`. A newer version
than this reader knows is refused with a clear message.

safetensors rather than pickle: a batch is data, and loading it must not run code.

The writer (the orchestrator) builds the tensors with numpy: an orchestrator never imports
torch, which would cost every run ~190 MB and ~1.6 CPU-seconds to start. The reader (the
trainer) loads them as torch tensors.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from safetensors.numpy import save_file

from workbench.files import layout
from workbench.system.clock import now_iso

if TYPE_CHECKING:
    import torch

FORMAT = "workbench.rollouts"
VERSION = 2
# Version 1 lacks loss_mask (every completion token trained); the reader derives it.
_READABLE_VERSIONS = (1, 2)
_TENSORS = (
    "input_ids",
    "sample_lengths",
    "prompt_lengths",
    "inference_logprobs",
    "advantages",
    "rewards",
)


class InvalidRollouts(ValueError):
    """A rollout batch that cannot be trained on; the message says which sample and why."""


@dataclass
class Sample:
    """One episode of one prompt: the prompt, then everything after it (the completion).

    `completion_mask` has one value per completion token: True where the model sampled it
    (it is trained), False where the environment added it between the model's turns. None
    means every completion token is the model's, as in every single-turn episode.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    advantage: float
    reward: float
    completion_mask: list[bool] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def trained(self) -> list[bool]:
        """Per completion token, whether it carries loss."""
        if self.completion_mask is None:
            return [True] * len(self.completion_ids)
        return [bool(value) for value in self.completion_mask]


@dataclass
class RolloutBatch:
    run_id: str
    step: int
    policy_version: int
    samples: list[Sample] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)


def write_rollouts(run: Path, batch: RolloutBatch) -> Path:
    """Write `rollouts/step_N/` atomically; returns the step directory.

    A sample whose `completion_mask` is not one value per completion token cannot be
    written (the format would attribute its values to the wrong tokens): `InvalidRollouts`
    names it, and nothing is written. Anything else is left for the reader to judge.
    """
    samples = batch.samples
    for i, s in enumerate(samples):
        if s.completion_mask is not None and len(s.completion_mask) != len(s.completion_ids):
            raise InvalidRollouts(
                f"sample {i} has a completion_mask of {len(s.completion_mask)} values for "
                f"{len(s.completion_ids)} completion tokens; it needs one per completion token"
            )
    tensors = {
        "input_ids": np.array(
            [t for s in samples for t in (*s.prompt_ids, *s.completion_ids)], dtype=np.int64
        ),
        "sample_lengths": np.array([s.num_tokens for s in samples], dtype=np.int64),
        "prompt_lengths": np.array([len(s.prompt_ids) for s in samples], dtype=np.int64),
        "loss_mask": np.array(
            [m for s in samples for m in ([False] * len(s.prompt_ids) + s.trained())],
            dtype=np.uint8,
        ),
        "inference_logprobs": np.array(
            [lp for s in samples for lp in ([0.0] * len(s.prompt_ids) + _trained_logprobs(s))],
            dtype=np.float32,
        ),
        "advantages": np.array([s.advantage for s in samples], dtype=np.float32),
        "rewards": np.array([s.reward for s in samples], dtype=np.float32),
    }
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "run_id": batch.run_id,
        "step": batch.step,
        "policy_version": batch.policy_version,
        "num_samples": len(samples),
        "num_tokens": batch.num_tokens,
        "created_at": now_iso(),
    }
    final = layout.rollout_dir(run, batch.step)
    with layout.staged_directory(final) as staging:
        save_file(tensors, str(staging / "batch.safetensors"))
        (staging / "batch.json").write_text(json.dumps(meta, indent=2))
    return final


def _trained_logprobs(sample: Sample) -> list[float]:
    """The completion's log-probs with 0 on the tokens the environment added."""
    logprobs = list(sample.completion_logprobs)
    if sample.completion_mask is not None:
        for t, trained in enumerate(sample.completion_mask[: len(logprobs)]):
            if not trained:
                logprobs[t] = 0.0
    return logprobs


@dataclass
class TensorBatch:
    """A read, validated batch as flat tensors (what the packer consumes).

    `loss_mask` is bool [num_tokens], True on the tokens that carry loss; a version 1 batch
    gets it derived from `prompt_lengths` (every completion token).
    """

    run_id: str
    step: int
    policy_version: int
    input_ids: torch.Tensor
    sample_lengths: torch.Tensor
    prompt_lengths: torch.Tensor
    loss_mask: torch.Tensor
    inference_logprobs: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor

    @property
    def num_samples(self) -> int:
        return int(self.sample_lengths.numel())

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def samples(self) -> list[Sample]:
        """The samples as written; a completion that is all trained has mask None."""
        out = []
        offsets = self.sample_lengths.cumsum(0) - self.sample_lengths
        for i in range(self.num_samples):
            start, length, prompt = (
                int(offsets[i]),
                int(self.sample_lengths[i]),
                int(self.prompt_lengths[i]),
            )
            ids = self.input_ids[start : start + length].tolist()
            trained = self.loss_mask[start + prompt : start + length].bool()
            out.append(
                Sample(
                    prompt_ids=ids[:prompt],
                    completion_ids=ids[prompt:],
                    completion_logprobs=self.inference_logprobs[
                        start + prompt : start + length
                    ].tolist(),
                    advantage=float(self.advantages[i]),
                    reward=float(self.rewards[i]),
                    completion_mask=None if bool(trained.all()) else trained.tolist(),
                )
            )
        return out


def completion_loss_mask(
    sample_lengths: torch.Tensor, prompt_lengths: torch.Tensor
) -> torch.Tensor:
    """bool [num_tokens], True on every completion token: a version 1 batch's mask."""
    import torch

    offsets = sample_lengths.cumsum(0) - sample_lengths
    position = torch.arange(int(sample_lengths.sum())) - torch.repeat_interleave(
        offsets, sample_lengths
    )
    return position >= torch.repeat_interleave(prompt_lengths, sample_lengths)


def read_rollouts(
    step_dir: Path, *, vocab_size: int | None = None, max_sample_tokens: int | None = None
) -> TensorBatch:
    """Load and validate `rollouts/step_N/`; any problem raises `InvalidRollouts`."""
    where = str(step_dir)
    try:
        meta = json.loads((step_dir / "batch.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidRollouts(f"{where}: batch.json is missing") from None
    except json.JSONDecodeError as err:
        raise InvalidRollouts(f"{where}/batch.json is not valid JSON: {err}") from None
    if meta.get("format") != FORMAT:
        raise InvalidRollouts(
            f"{where}: not a workbench rollout batch (format={meta.get('format')!r})"
        )
    version = meta.get("version")
    if version not in _READABLE_VERSIONS:
        raise InvalidRollouts(
            f"{where}: rollout format version {version} but this trainer reads versions "
            f"{_READABLE_VERSIONS[0]} to {VERSION}; run the same workbench version for "
            "trainer and orchestrator"
        )
    from safetensors.torch import load_file  # the trainer's side: torch is loaded there

    try:
        tensors = load_file(str(step_dir / "batch.safetensors"))
    except Exception as err:
        raise InvalidRollouts(f"{where}/batch.safetensors cannot be read: {err}") from None
    needed = _TENSORS if version == 1 else (*_TENSORS, "loss_mask")
    missing = [name for name in needed if name not in tensors]
    if missing:
        raise InvalidRollouts(f"{where}: batch.safetensors lacks {', '.join(missing)}")
    if version == 1:
        tensors["loss_mask"] = _version_1_mask(tensors)
    batch = TensorBatch(
        run_id=str(meta.get("run_id", "")),
        step=int(meta.get("step", -1)),
        policy_version=int(meta.get("policy_version", 0)),
        **{name: tensors[name] for name in (*_TENSORS, "loss_mask")},
    )
    _validate(batch, where, vocab_size, max_sample_tokens)
    batch.loss_mask = batch.loss_mask.bool()
    # Only trained tokens have the sampler's log-probs; whatever a writer left on the
    # others never reaches the trainer.
    batch.inference_logprobs = batch.inference_logprobs.where(batch.loss_mask, 0.0)
    return batch


def _version_1_mask(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The mask a version 1 batch implies; empty where its lengths cannot give one, which
    validation then reports (it checks the lengths first)."""
    import torch

    try:
        return completion_loss_mask(tensors["sample_lengths"], tensors["prompt_lengths"])
    except (RuntimeError, TypeError, ValueError):
        return torch.zeros(0, dtype=torch.bool)


def _validate(
    batch: TensorBatch, where: str, vocab_size: int | None, max_tokens: int | None
) -> None:
    _check_shapes(batch, where)
    _check_token_ids(batch, where, vocab_size)
    _check_loss_mask_values(batch, where)
    mask = batch.loss_mask.bool()
    offsets = batch.sample_lengths.cumsum(0) - batch.sample_lengths
    for i in range(batch.num_samples):
        _check_sample(batch, i, int(offsets[i]), mask, where, max_tokens)


def _check_shapes(batch: TensorBatch, where: str) -> None:
    """One value per token in the token tensors, one per sample in the others, adding up."""
    n = batch.num_samples
    if n == 0:
        raise InvalidRollouts(f"{where}: the batch is empty (0 samples)")
    for name in ("input_ids", "inference_logprobs", "loss_mask"):
        tensor = getattr(batch, name)
        if tensor.dim() != 1:
            raise InvalidRollouts(f"{where}: {name} must be 1-D, got shape {tuple(tensor.shape)}")
    for name in ("sample_lengths", "prompt_lengths", "advantages", "rewards"):
        tensor = getattr(batch, name)
        if tuple(tensor.shape) != (n,):
            raise InvalidRollouts(
                f"{where}: {name} has shape {tuple(tensor.shape)}, expected ({n},)"
            )
    if (batch.sample_lengths < 1).any():
        i = int((batch.sample_lengths < 1).nonzero()[0])
        raise InvalidRollouts(f"{where}: sample {i} has {int(batch.sample_lengths[i])} tokens")
    total = int(batch.sample_lengths.sum())
    if batch.num_tokens != total or batch.inference_logprobs.numel() != total:
        raise InvalidRollouts(
            f"{where}: sample_lengths add up to {total} tokens but input_ids has "
            f"{batch.num_tokens} and inference_logprobs {batch.inference_logprobs.numel()}"
        )
    if batch.loss_mask.numel() != total:
        raise InvalidRollouts(
            f"{where}: loss_mask has {batch.loss_mask.numel()} values but sample_lengths add "
            f"up to {total} tokens; it needs one per token"
        )


def _sample_of(batch: TensorBatch, token: int) -> int:
    """The sample that the batch's `token`-th token belongs to."""
    return int((batch.sample_lengths.cumsum(0) <= token).sum())


def _check_token_ids(batch: TensorBatch, where: str, vocab_size: int | None) -> None:
    if (
        vocab_size is not None
        and batch.num_tokens
        and (int(batch.input_ids.min()) < 0 or int(batch.input_ids.max()) >= vocab_size)
    ):
        bad = int(((batch.input_ids < 0) | (batch.input_ids >= vocab_size)).nonzero()[0])
        raise InvalidRollouts(
            f"{where}: sample {_sample_of(batch, bad)} has token id {int(batch.input_ids[bad])} "
            f"outside the vocabulary (size {vocab_size})"
        )


def _check_loss_mask_values(batch: TensorBatch, where: str) -> None:
    import torch

    mask = batch.loss_mask
    if mask.dtype not in (torch.uint8, torch.bool):
        raise InvalidRollouts(f"{where}: loss_mask must be uint8, got {mask.dtype}")
    if mask.dtype == torch.uint8 and (mask > 1).any():
        bad = int((mask > 1).nonzero()[0])
        raise InvalidRollouts(
            f"{where}: sample {_sample_of(batch, bad)} has loss_mask value {int(mask[bad])}; "
            "it is 1 on trained tokens and 0 elsewhere"
        )


def _check_sample(
    batch: TensorBatch,
    i: int,
    start: int,
    mask: torch.Tensor,
    where: str,
    max_tokens: int | None,
) -> None:
    """Sample `i` (from token `start`): a prompt and a completion, within the trainer's
    seq_len, trained on some sampled completion tokens only, with their log-probs."""
    length, prompt = int(batch.sample_lengths[i]), int(batch.prompt_lengths[i])
    if prompt < 1 or prompt >= length:
        raise InvalidRollouts(
            f"{where}: sample {i} has {prompt} prompt tokens of {length}; it needs a "
            "non-empty prompt and at least one completion token"
        )
    if max_tokens is not None and length > max_tokens:
        raise InvalidRollouts(
            f"{where}: sample {i} has {length} tokens, longer than the trainer's "
            f"seq_len {max_tokens}; lower sampling.max_tokens or raise [trainer] seq_len"
        )
    if mask[start : start + prompt].any():
        raise InvalidRollouts(
            f"{where}: sample {i} has loss_mask 1 on a prompt token; the prompt is never trained"
        )
    trained = mask[start + prompt : start + length]
    if not trained.any():
        raise InvalidRollouts(
            f"{where}: sample {i} has no trained token: its loss_mask is 0 on all "
            f"{length - prompt} completion tokens (none of them was sampled by the model)"
        )
    logprobs = batch.inference_logprobs[start + prompt : start + length][trained]
    if not logprobs.isfinite().all() or (logprobs > 1e-4).any():
        raise InvalidRollouts(
            f"{where}: sample {i} has log-probs that are not finite or > 0 on its trained tokens"
        )
    if not math.isfinite(float(batch.advantages[i])):
        raise InvalidRollouts(f"{where}: sample {i} has a non-finite advantage")
