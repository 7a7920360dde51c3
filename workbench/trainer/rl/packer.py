"""The packer (master rank): rollout batches in, packed micro-batches out.

Each trainer step takes, for every active run whose next `rollouts/step_N` is STABLE, that
whole batch; validates it (an invalid batch evicts only its run, with the reason); updates
the run's progress and marks it ready; then packs all samples into micro-batches of at most
`seq_len` tokens with each run's tokens contiguous, in slot order, so `MultiLoRALinear` can
route them by per-run token counts (`lora_num_tokens`).

Every per-token field is aligned with `input_ids`: `loss_mask[t]` says token t carries
loss, which is the batch's own mask: the tokens the model sampled, not the prompt and not
what the environment added between a multi-turn episode's turns. `inference_logprobs[t]` is
the sampler's log-prob of token t, as `compute_logprobs` gives the trainer's. The first
token of a sample is always a prompt token, so the one log-prob that would be "predicted"
across a sample boundary never counts.

The packer keeps an episode whole: a sample is never split across rows, since its later
turns must attend to all of its earlier tokens. Each run's loss is normalised by its
trained tokens over the whole step (`run_loss_tokens`), or, for `loss.aggregation =
"sequence_mean"`, by its completions over the whole step (`run_samples`); prompt and
environment tokens do not count.

With `share_prompts`, the completions of one prompt that land in the same row share it:
the first is packed whole, each next one from its last untrained token before its first
difference (usually the prompt's last token), with position ids that go on from there.
`attention.PackedSequences` reads that as a branch attending to the first's tokens. A
prompt of 13 tokens with 8 completions of 10 is 100 tokens instead of 184.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from workbench.files import layout
from workbench.files.rollouts import InvalidRollouts, TensorBatch, read_rollouts
from workbench.trainer.runs.manager import MultiRunManager

logger = logging.getLogger(__name__)


@dataclass
class MicroBatch:
    """One packed row: runs' samples back to back, each run's tokens contiguous."""

    input_ids: torch.Tensor  # int64 [T]
    position_ids: torch.Tensor  # int64 [T], from 0 for every sample (a branch: see above)
    loss_mask: torch.Tensor  # bool [T], True on the tokens the model sampled
    inference_logprobs: torch.Tensor  # float32 [T], the sampler's log-prob of each token
    advantages: torch.Tensor  # float32 [T]
    lora_num_tokens: torch.Tensor  # int64 [max_runs], tokens of each run in this row
    run_loss_tokens: torch.Tensor  # int64 [max_runs], trained tokens of each run in the WHOLE step
    # int64 [max_runs], completions of each run in the WHOLE step (sequence_mean's count)
    run_samples: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


@dataclass
class _PackedSample:
    idx: int
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    inference_logprobs: torch.Tensor
    advantage: float
    prompt_length: int

    def shared_with(self, first: _PackedSample) -> int:
        """How many leading tokens this sample can take from `first`, packed before it in
        the same row: none unless both have the same prompt; else up to its last untrained
        token before the two differ, which stays its own (its log-prob is read from the
        token before it in the row, and it carries no loss)."""
        if self.prompt_length != first.prompt_length or not torch.equal(
            self.input_ids[: self.prompt_length], first.input_ids[: self.prompt_length]
        ):
            return 0
        n = min(self.input_ids.numel(), first.input_ids.numel())
        differs = torch.nonzero(self.input_ids[:n] != first.input_ids[:n])
        common = int(differs[0]) if differs.numel() else n
        first_trained = int(torch.nonzero(self.loss_mask)[0])  # validated: one exists
        return min(common, first_trained) - 1


class Packer:
    def __init__(
        self,
        manager: MultiRunManager,
        seq_len: int,
        vocab_size: int | None = None,
        share_prompts: bool = False,
    ):
        self.manager = manager
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.share_prompts = share_prompts

    def collect(self) -> dict[int, TensorBatch]:
        """Read each active run's next batch if it is ready; mark those runs ready.

        A run's next batch is `rollouts/step_{progress.step}`. Invalid batches evict their
        run (the reason names the sample and what is wrong) and are skipped.
        """
        manager = self.manager
        batches: dict[int, TensorBatch] = {}
        for idx in manager.used_idxs:
            if manager.ready_to_update[idx]:
                continue
            run = manager.get_run_dir(idx)
            step = manager.progress[idx].step
            step_dir = layout.rollout_dir(run, step)
            if not layout.is_stable(step_dir):
                continue
            try:
                batch = read_rollouts(
                    step_dir, vocab_size=self.vocab_size, max_sample_tokens=self.seq_len
                )
            except InvalidRollouts as err:
                manager.evict_run(idx, f"invalid rollout batch: {err}")
                continue
            batches[idx] = batch
            progress = manager.progress[idx]
            progress.step += 1
            progress.total_tokens += batch.num_tokens
            progress.total_samples += batch.num_samples
            manager.ready_to_update[idx] = True
        return batches

    def pack(self, batches: dict[int, TensorBatch], world_size: int = 1) -> list[list[MicroBatch]]:
        """Pack every batch into micro-batches and share them out: one list per rank."""
        rows = pack_batches(batches, self.seq_len, self.manager.max_runs, self.share_prompts)
        return distribute(rows, world_size)


def pack_batches(
    batches: dict[int, TensorBatch], seq_len: int, max_runs: int, share_prompts: bool = False
) -> list[MicroBatch]:
    """Greedy packing in slot order: a row is closed when the next sample does not fit.

    Slot order keeps each run's tokens contiguous inside a row, which is what per-run token
    counts need. Samples are never split across rows: attention must see a whole sample.
    With `share_prompts`, a sample whose prompt is that of the last sample packed whole in
    the row (same run) leaves out what it shares with it (`_PackedSample.shared_with`).
    """
    samples = [s for idx in sorted(batches) for s in _split_samples(idx, batches[idx])]
    run_loss_tokens = torch.zeros(max_runs, dtype=torch.int64)
    run_samples = torch.zeros(max_runs, dtype=torch.int64)
    for sample in samples:
        run_loss_tokens[sample.idx] += int(sample.loss_mask.sum())
        run_samples[sample.idx] += 1
    rows: list[list[tuple[_PackedSample, int]]] = []
    current: list[tuple[_PackedSample, int]] = []
    used = 0
    whole: _PackedSample | None = None  # the row's last sample packed whole
    for sample in samples:
        shared = 0
        if share_prompts and whole is not None and whole.idx == sample.idx:
            shared = max(0, sample.shared_with(whole))
            if shared == current[-1][0].input_ids.numel():
                # Its positions would go on from the previous sample's, which would read as
                # one sample: one token fewer shared keeps the boundary.
                shared -= 1
        length = sample.input_ids.numel() - shared
        if current and used + length > seq_len:
            rows.append(current)
            current, used, whole = [], 0, None
            shared, length = 0, sample.input_ids.numel()
        current.append((sample, shared))
        used += length
        if not shared:
            whole = sample
    if current:
        rows.append(current)
    return [_build_row(row, max_runs, run_loss_tokens, run_samples) for row in rows]


def distribute(rows: list[MicroBatch], world_size: int) -> list[list[MicroBatch]]:
    """Give each rank a share with about the same number of tokens (largest rows first)."""
    shares: list[list[MicroBatch]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for row in sorted(rows, key=lambda r: -r.num_tokens):
        rank = loads.index(min(loads))
        shares[rank].append(row)
        loads[rank] += row.num_tokens
    return shares


def _split_samples(idx: int, batch: TensorBatch) -> list[_PackedSample]:
    out = []
    start = 0
    for length, prompt_length, advantage in zip(
        batch.sample_lengths.tolist(),
        batch.prompt_lengths.tolist(),
        batch.advantages.tolist(),
        strict=True,
    ):
        out.append(
            _PackedSample(
                idx=idx,
                input_ids=batch.input_ids[start : start + length],
                loss_mask=batch.loss_mask[start : start + length].bool(),
                inference_logprobs=batch.inference_logprobs[start : start + length],
                advantage=advantage,
                prompt_length=prompt_length,
            )
        )
        start += length
    return out


def _build_row(
    row: list[tuple[_PackedSample, int]],
    max_runs: int,
    run_loss_tokens: torch.Tensor,
    run_samples: torch.Tensor,
) -> MicroBatch:
    """`row`: each sample and how many of its leading tokens it shares (left out)."""
    input_ids, positions, mask, logprobs, advantages = [], [], [], [], []
    counts = torch.zeros(max_runs, dtype=torch.int64)
    for sample, shared in row:
        length = sample.input_ids.numel()
        counts[sample.idx] += length - shared
        input_ids.append(sample.input_ids[shared:])
        positions.append(torch.arange(shared, length, dtype=torch.int64))
        mask.append(sample.loss_mask[shared:])
        logprobs.append(sample.inference_logprobs[shared:])
        advantages.append(torch.full((length - shared,), sample.advantage, dtype=torch.float32))
    return MicroBatch(
        input_ids=torch.cat(input_ids),
        position_ids=torch.cat(positions),
        loss_mask=torch.cat(mask).bool(),
        inference_logprobs=torch.cat(logprobs).float(),
        advantages=torch.cat(advantages),
        lora_num_tokens=counts,
        run_loss_tokens=run_loss_tokens.clone(),
        run_samples=run_samples.clone(),
    )


def filler_row(max_runs: int, tokens: int = 2) -> MicroBatch:
    """A row that trains nothing, for a rank with fewer rows than another when the base is
    sharded: every rank must run as many forwards and backwards as the others, since each
    layer's weights are gathered from all ranks. Its tokens go through slot 0, no loss."""
    counts = torch.zeros(max_runs, dtype=torch.int64)
    counts[0] = tokens
    return MicroBatch(
        input_ids=torch.zeros(tokens, dtype=torch.int64),
        position_ids=torch.arange(tokens, dtype=torch.int64),
        loss_mask=torch.zeros(tokens, dtype=torch.bool),
        inference_logprobs=torch.zeros(tokens, dtype=torch.float32),
        advantages=torch.zeros(tokens, dtype=torch.float32),
        lora_num_tokens=counts,
        run_loss_tokens=torch.zeros(max_runs, dtype=torch.int64),
    )
