"""vLLM's multi-LoRA product on the CPU as two batched products per layer, not one per token.

vLLM's CPU wrapper (`PunicaWrapperCPU`, through `vllm.lora.ops.torch_ops`) gathers every
token's own copy of its adapter's matrices (`lora_b_weights[token_indices]`, T x out x r
floats) and multiplies them one token at a time (`einsum("bi,boi->bo")`). With many
sequences in a batch that copy is most of a decode step: on the built-in model, 4 runs of
128 completions, the LoRA layers took 44 % of vLLM's worker thread and the base model's own
products 9 % (py-spy, vLLM 0.32 CPU).

Here the tokens are grouped by adapter slot once per step, and each layer computes every
slot's tokens with that slot's weights in two batched products:

    y[rows(s)] += (x[rows(s)] @ A_s^T) @ B_s^T        for every slot s with tokens

Each slot's rows are padded to the same count (`ProductBatch`), so one `bmm` does every
slot: with 32 runs in a step, a product per slot was 32 x 4 small operations a layer, whose
fixed cost was most of their time. A slot with many more tokens than the others (a prompt's
prefill beside decoding runs) is multiplied on its own rather than padding every slot to it
(`plan_products`).

A merged projection's slices (q, k and v; gate and up) go in the same two products: the
slices' A side by side, their B on a block diagonal (`LayerWeights`, a slot copied again
only after vLLM wrote an adapter into the layer). Those are float32 copies of the layer's slots, kept
beside vLLM's own, a merged projection's B as many times larger as it has slices: on the
CPU, where adapters are small next to the model, fewer and larger products are worth it.

Each row's delta comes out bit for bit the same whichever batch it is in and however many
tokens its adapter has in the step, which is what a run's curve not depending on the other
runs rests on: a batched product's rows equal the same rows multiplied alone, and a group of
very few tokens is padded to a few rows (`MIN_PRODUCT_ROWS`). A token with no adapter (slot
-1) is in no group and gets no delta, as on the GPU (vLLM's CPU ops would index the last
slot with it).

Only `add_lora_linear`, the linear layers' entry, changes; embeddings, logits and the
sharded layers' separate shrink and expand keep vLLM's path, and so does any call whose
token count does not match the step's mapping. `workbench.inference.vllm_plugin` puts this
class in vLLM's place where workbench starts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

# Products of very few rows go through other BLAS kernels (gemv, small-M kernels) whose
# float sums round differently: with torch 2.13's CPU matmul on this project's machines,
# M <= 3 rows of [M, k] @ [k, n] differ in their last bits from the same rows inside a
# larger product, for LoRA's rank and width shapes. A slot with fewer tokens than this is
# padded to this many rows (with margin over 3, as the cut-off is the BLAS build's choice),
# so a token's delta does not depend on how many tokens of its adapter share the step,
# and a run's curve not on which other runs share the server.
MIN_PRODUCT_ROWS = 16

# A slot with more tokens than this many times the step's median slot, or than
# `BATCHED_ROWS`, is multiplied on its own: padding every other slot to its size would
# multiply mostly padding, and a product that large pays its fixed cost once anyway (a
# batched product of 32 slots' tokens computed as fast as 32 products at 128 tokens a
# slot, and 2-3x as fast at 16 to 64, on the built-in model's shapes on one core).
OUTLIER_RATIO = 2
BATCHED_ROWS = 64


@dataclass(frozen=True)
class ProductBatch:
    """Slots whose tokens one batched product computes, each slot's rows padded to `width`."""

    slots: Tensor  # [S] adapter slots, ascending
    slot_list: list[int]  # the same, as numbers
    width: int
    # The step's rows to multiply, [S * width]: each slot's rows, padded with repeats of its
    # last; None where the step's rows are multiplied as they are.
    gather: Tensor | None
    # Which of the S * width product rows are tokens, not padding; None for all.
    kept: Tensor | None
    # Those tokens' rows in the step, in order; None for every row of the step.
    rows: Tensor | None


def plan_products(token_slots: Tensor) -> list[ProductBatch]:
    """The step's tokens as batched products: every slot with tokens in one, except slots
    with more than `OUTLIER_RATIO` times the median slot's tokens, each in one of its own.
    Tokens of slot -1 are in none."""
    slots, counts = torch.unique(token_slots, return_counts=True)
    adapted = slots >= 0
    slots, counts = slots[adapted], counts[adapted]
    if slots.numel() == 0:
        return []
    # Each slot's rows in order: a stable sort keeps a slot's rows ascending.
    order = torch.argsort(token_slots, stable=True)[token_slots.shape[0] - int(counts.sum()) :]
    starts = torch.cumsum(counts, 0) - counts
    cap = min(BATCHED_ROWS, max(MIN_PRODUCT_ROWS, OUTLIER_RATIO * int(counts.median())))
    small = counts <= cap
    batches = []
    if small.any():
        batches.append(_batch(order, slots[small], starts[small], counts[small], token_slots))
    for index in (~small).nonzero().flatten().tolist():
        one = slice(index, index + 1)
        batches.append(_batch(order, slots[one], starts[one], counts[one], token_slots))
    return batches


def _batch(
    order: Tensor, slots: Tensor, starts: Tensor, counts: Tensor, token_slots: Tensor
) -> ProductBatch:
    width = max(MIN_PRODUCT_ROWS, int(counts.max()))
    every_row = slots.numel() == 1 and int(counts[0]) == token_slots.shape[0]
    if every_row and width == token_slots.shape[0]:
        return ProductBatch(slots, slots.tolist(), width, gather=None, kept=None, rows=None)
    column = torch.arange(width)
    # Row j of a slot's product is its token j, or its last token where j is padding.
    positions = starts[:, None] + torch.minimum(column[None, :], counts[:, None] - 1)
    real = (column[None, :] < counts[:, None]).flatten()
    gather = order[positions.flatten()]
    kept = None if bool(real.all()) else real.nonzero().flatten()
    return ProductBatch(
        slots,
        slots.tolist(),
        width,
        gather=gather,
        kept=kept,
        rows=None if every_row else gather[real],
    )


@dataclass
class LayerWeights:
    """A layer's adapters as two float32 stacks over its slots: `shrink` [slots, in, ranks]
    (every slice's A, transposed, side by side) and `expand` [slots, ranks, out] (each
    slice's B, transposed, on the block diagonal). `(x @ shrink[s]) @ expand[s]` is every
    slice's delta side by side: a merged projection (qkv, gate_up) takes two products
    instead of two per slice, and each zero of the diagonal's off blocks adds exactly
    nothing to a finite product. A slot is copied from vLLM's weights when a step uses it
    and it is not `fresh`: vLLM writes an adapter into its slot in place (`set_lora`, also
    to reload one under its id), which moves the weights' versions on and makes every slot
    stale, as the versions do not say which slot was written."""

    layer: Tensor
    versions: tuple[int, ...] | None
    shrink: Tensor
    expand: Tensor
    fresh: set[int]

    @classmethod
    def empty(
        cls, lora_a_stacked: tuple[Tensor, ...], lora_b_stacked: tuple[Tensor, ...]
    ) -> LayerWeights:
        slots, _, _, width = lora_a_stacked[0].shape
        ranks = sum(lora_a.shape[2] for lora_a in lora_a_stacked)
        out = sum(lora_b.shape[2] for lora_b in lora_b_stacked)
        return cls(
            layer=lora_a_stacked[0],
            versions=None,
            shrink=torch.zeros(slots, width, ranks),
            expand=torch.zeros(slots, ranks, out),
            fresh=set(),
        )

    def refresh(
        self,
        lora_a_stacked: tuple[Tensor, ...],
        lora_b_stacked: tuple[Tensor, ...],
        slots: list[int],
    ) -> None:
        """Copy `slots`' adapters in where they are not fresh."""
        versions = weights_version(lora_a_stacked + lora_b_stacked)
        if versions is None or versions != self.versions:
            self.fresh.clear()
            self.versions = versions
        stale_slots = [slot for slot in slots if slot not in self.fresh]
        if not stale_slots:
            return
        stale = torch.tensor(stale_slots)
        self.shrink[stale] = (
            torch.cat([lora_a.index_select(0, stale)[:, 0] for lora_a in lora_a_stacked], dim=1)
            .transpose(1, 2)
            .to(torch.float32)
        )
        rank_at = out_at = 0
        for lora_b in lora_b_stacked:
            width, rank = lora_b.shape[-2:]
            block = lora_b.index_select(0, stale)[:, 0].transpose(1, 2).to(torch.float32)
            self.expand[stale, rank_at : rank_at + rank, out_at : out_at + width] = block
            rank_at, out_at = rank_at + rank, out_at + width
        # Weights without versions (made in inference mode) are copied again every time.
        if versions is not None:
            self.fresh.update(stale_slots)


def weights_version(tensors: tuple[Tensor, ...]) -> tuple[int, ...] | None:
    """The tensors' version counters (each write into them counts), or None for tensors
    made in inference mode, which keep none."""
    try:
        return tuple(tensor._version for tensor in tensors)
    except RuntimeError:
        return None


class SlotMatmulPunicaWrapperCPU(PunicaWrapperCPU):
    """`PunicaWrapperCPU` whose linear-layer LoRA products run batched over adapter slots."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Per step, from the mapping: shared by every layer of the step.
        self._batches: list[ProductBatch] = []
        self._slots: list[int] = []  # every slot the step uses
        self._weights: dict[int, LayerWeights] = {}  # by layer

    def update_metadata(
        self,
        mapping: Any,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        super().update_metadata(mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        self._batches = plan_products(self.token_lora_indices)
        self._slots = [slot for batch in self._batches for slot in batch.slot_list]

    def computes(self, rows: int) -> bool:
        """Whether this step's plan describes a layer input of `rows` tokens (never before
        the first step's mapping, when vLLM's count is None)."""
        return rows == self.indices_len[0]

    def layer_weights(
        self, lora_a_stacked: tuple[Tensor, ...], lora_b_stacked: tuple[Tensor, ...]
    ) -> LayerWeights:
        """The layer's `LayerWeights`, with every slot this step uses fresh."""
        layer = lora_a_stacked[0]
        weights = self._weights.get(id(layer))
        if weights is None or weights.layer is not layer:
            weights = self._weights[id(layer)] = LayerWeights.empty(lora_a_stacked, lora_b_stacked)
        weights.refresh(lora_a_stacked, lora_b_stacked, self._slots)
        return weights

    def add_lora_linear(
        self,
        y: Tensor,
        x: Tensor,
        lora_a_stacked: tuple[Tensor, ...],
        lora_b_stacked: tuple[Tensor, ...],
        scale: float,
        output_slices: tuple[int, ...],
        *,
        buffer: tuple[Tensor, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        # Our path writes every slice side by side over the whole of y, each B as wide as
        # its slice; anything else (padded or sharded slices) goes to vLLM's.
        widths = tuple(lora_b.shape[-2] for lora_b in lora_b_stacked)
        fills_y = y.ndim == 2 and widths == tuple(output_slices) and sum(widths) == y.shape[1]
        if not (self.computes(x.shape[0]) and fills_y):
            return super().add_lora_linear(
                y, x, lora_a_stacked, lora_b_stacked, scale, output_slices,
                buffer=buffer, **kwargs,
            )  # fmt: skip
        if not self._batches:
            return None
        # float32 products whatever the model's dtype, as vLLM's CPU ops compute them.
        x = x.to(torch.float32)
        weights = self.layer_weights(lora_a_stacked, lora_b_stacked)
        for batch in self._batches:
            tokens = x if batch.gather is None else x.index_select(0, batch.gather)
            if len(batch.slot_list) == 1:
                # One slot: its weights as they lie, no copy (the same rows as batched).
                (slot,) = batch.slot_list
                delta = (tokens @ weights.shrink[slot]) @ weights.expand[slot]
            else:
                tokens = tokens.view(len(batch.slot_list), batch.width, x.shape[1])
                delta = torch.bmm(
                    torch.bmm(tokens, weights.shrink.index_select(0, batch.slots)),
                    weights.expand.index_select(0, batch.slots),
                ).flatten(0, 1)
            if batch.kept is not None:
                delta = delta.index_select(0, batch.kept)
            if batch.rows is None:
                y.add_(delta.to(y.dtype), alpha=scale)
            else:
                y.index_add_(0, batch.rows, delta.to(y.dtype), alpha=scale)
        return None
