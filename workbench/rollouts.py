"""The rollout batch format: what an orchestrator writes and the trainer reads.

`run_<id>/rollouts/step_N/` holds one training batch, written whole (staged directory,
STABLE last) so the trainer never reads half a batch:

    batch.json          {"format": "workbench.rollouts", "version": 1, "run_id", "step",
                         "policy_version", "num_samples", "num_tokens", "created_at"}
    batch.safetensors   flat tensors, samples concatenated in order:
      input_ids            int64 [num_tokens]   prompt then completion tokens of each sample
      sample_lengths       int64 [num_samples]  prompt + completion tokens per sample
      prompt_lengths       int64 [num_samples]  tokens of the prompt part (no loss there)
      inference_logprobs   float32 [num_tokens] log-prob the sampler gave each completion
                                                token (0 on prompt tokens)
      advantages           float32 [num_samples]
      rewards              float32 [num_samples]

safetensors rather than pickle: a batch is data, and loading it must not run code. The
version is checked on read; a newer writer and an older reader fail with a clear message.

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

from workbench import layout
from workbench.clock import now_iso

if TYPE_CHECKING:
    import torch

FORMAT = "workbench.rollouts"
VERSION = 1
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
    """One completion of one prompt."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    advantage: float
    reward: float

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


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
    """Write `rollouts/step_N/` atomically; returns the step directory."""
    samples = batch.samples
    tensors = {
        "input_ids": np.array(
            [t for s in samples for t in (*s.prompt_ids, *s.completion_ids)], dtype=np.int64
        ),
        "sample_lengths": np.array([s.num_tokens for s in samples], dtype=np.int64),
        "prompt_lengths": np.array([len(s.prompt_ids) for s in samples], dtype=np.int64),
        "inference_logprobs": np.array(
            [
                lp
                for s in samples
                for lp in ([0.0] * len(s.prompt_ids) + list(s.completion_logprobs))
            ],
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


@dataclass
class TensorBatch:
    """A read, validated batch as flat tensors (what the packer consumes)."""

    run_id: str
    step: int
    policy_version: int
    input_ids: torch.Tensor
    sample_lengths: torch.Tensor
    prompt_lengths: torch.Tensor
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
        out = []
        offsets = self.sample_lengths.cumsum(0) - self.sample_lengths
        for i in range(self.num_samples):
            start, length, prompt = (
                int(offsets[i]),
                int(self.sample_lengths[i]),
                int(self.prompt_lengths[i]),
            )
            ids = self.input_ids[start : start + length].tolist()
            out.append(
                Sample(
                    prompt_ids=ids[:prompt],
                    completion_ids=ids[prompt:],
                    completion_logprobs=self.inference_logprobs[
                        start + prompt : start + length
                    ].tolist(),
                    advantage=float(self.advantages[i]),
                    reward=float(self.rewards[i]),
                )
            )
        return out


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
    if meta.get("version") != VERSION:
        raise InvalidRollouts(
            f"{where}: rollout format version {meta.get('version')} but this trainer reads "
            f"version {VERSION}; run the same workbench version for trainer and orchestrator"
        )
    from safetensors.torch import load_file  # the trainer's side: torch is loaded there

    try:
        tensors = load_file(str(step_dir / "batch.safetensors"))
    except Exception as err:
        raise InvalidRollouts(f"{where}/batch.safetensors cannot be read: {err}") from None
    missing = [name for name in _TENSORS if name not in tensors]
    if missing:
        raise InvalidRollouts(f"{where}: batch.safetensors lacks {', '.join(missing)}")
    batch = TensorBatch(
        run_id=str(meta.get("run_id", "")),
        step=int(meta.get("step", -1)),
        policy_version=int(meta.get("policy_version", 0)),
        **{name: tensors[name] for name in _TENSORS},
    )
    _validate(batch, where, vocab_size, max_sample_tokens)
    return batch


def _validate(
    batch: TensorBatch, where: str, vocab_size: int | None, max_tokens: int | None
) -> None:
    n = batch.num_samples
    if n == 0:
        raise InvalidRollouts(f"{where}: the batch is empty (0 samples)")
    for name in ("input_ids", "inference_logprobs"):
        tensor = getattr(batch, name)
        if tensor.dim() != 1:
            raise InvalidRollouts(f"{where}: {name} must be 1-D, got shape {tuple(tensor.shape)}")
    for name in ("sample_lengths", "prompt_lengths", "advantages", "rewards"):
        tensor = getattr(batch, name)
        if tuple(tensor.shape) != (n,):
            raise InvalidRollouts(
                f"{where}: {name} has shape {tuple(tensor.shape)}, expected ({n},)"
            )
    total = int(batch.sample_lengths.sum())
    if batch.num_tokens != total or batch.inference_logprobs.numel() != total:
        raise InvalidRollouts(
            f"{where}: sample_lengths add up to {total} tokens but input_ids has "
            f"{batch.num_tokens} and inference_logprobs {batch.inference_logprobs.numel()}"
        )
    if (
        vocab_size is not None
        and total
        and (int(batch.input_ids.min()) < 0 or int(batch.input_ids.max()) >= vocab_size)
    ):
        bad = int(((batch.input_ids < 0) | (batch.input_ids >= vocab_size)).nonzero()[0])
        sample = int((batch.sample_lengths.cumsum(0) <= bad).sum())  # the sample holding it
        raise InvalidRollouts(
            f"{where}: sample {sample} has token id {int(batch.input_ids[bad])} outside the "
            f"vocabulary (size {vocab_size})"
        )
    offsets = batch.sample_lengths.cumsum(0) - batch.sample_lengths
    for i in range(n):
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
        start = int(offsets[i])
        logprobs = batch.inference_logprobs[start + prompt : start + length]
        if not logprobs.isfinite().all() or (logprobs > 1e-4).any():
            raise InvalidRollouts(f"{where}: sample {i} has log-probs that are not finite or > 0")
        if not math.isfinite(float(batch.advantages[i])):
            raise InvalidRollouts(f"{where}: sample {i} has a non-finite advantage")
