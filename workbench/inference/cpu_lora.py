"""vLLM's multi-LoRA product on the CPU as two matrix products per adapter, not one per token.

vLLM's CPU wrapper (`PunicaWrapperCPU`, through `vllm.lora.ops.torch_ops`) gathers every
token's own copy of its adapter's matrices (`lora_b_weights[token_indices]`, T x out x r
floats) and multiplies them one token at a time (`einsum("bi,boi->bo")`). With many
sequences in a batch that copy is most of a decode step: on the built-in model, 4 runs of
128 completions, the LoRA layers took 44 % of vLLM's worker thread and the base model's own
products 9 % (py-spy, vLLM 0.32 CPU).

Here the tokens are grouped by adapter slot once per step, and each layer computes each
slot's tokens with that slot's weights in two ordinary products:

    y[rows(s)] += (x[rows(s)] @ A_s^T) @ B_s^T        for every slot s with tokens

A merged projection's slices (q, k and v; gate and up) go in the same two products: the
slices' A side by side, their B on a block diagonal (`slot_weights`, made once per adapter
a slot takes, not per step). Those are float32 copies of each used slot's adapter, kept
beside vLLM's own, a merged projection's B as many times larger as it has slices: on the
CPU, where adapters are small next to the model, fewer and larger products are worth it.

Each weight is read once per step, and the work is that of the tokens, whatever the number
of slots (`[inference] max_loras`). When one slot has every token of the step, as with a
single run, no rows are gathered at all. A slot with very few tokens is padded to a few rows
(`MIN_PRODUCT_ROWS`), so that each token's delta comes out bit for bit the same however
many tokens of its adapter the step holds. A token with no adapter (slot -1) is in no group
and gets no delta, as on the GPU (vLLM's CPU ops would index the last slot with it).

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


@dataclass(frozen=True)
class SlotTokens:
    """One adapter slot's tokens in a step."""

    slot: int
    # Their rows in the step, or None for every row in order (one slot has all tokens).
    rows: Tensor | None
    # The rows to multiply: `rows` padded to MIN_PRODUCT_ROWS with repeats of the last
    # row, or None where the step's tokens can be multiplied as they are.
    gather: Tensor | None
    count: int


def tokens_by_slot(token_slots: Tensor) -> list[SlotTokens]:
    """Each adapter slot that has tokens, with their rows; tokens of slot -1 are in none."""
    groups = []
    for slot in torch.unique(token_slots).tolist():
        if slot < 0:
            continue
        rows = (token_slots == slot).nonzero().squeeze(1)
        count = rows.shape[0]
        every_row = count == token_slots.shape[0]
        if count < MIN_PRODUCT_ROWS:
            gather = torch.cat([rows, rows[-1:].expand(MIN_PRODUCT_ROWS - count)])
        else:
            gather = None if every_row else rows
        groups.append(SlotTokens(slot, None if every_row else rows, gather, count))
    return groups


# (shrink, expand) of one slot's adapter in one layer: see `slot_weights`.
WeightPair = tuple[Tensor, Tensor]


def slot_weights(
    lora_a_stacked: tuple[Tensor, ...], lora_b_stacked: tuple[Tensor, ...], slot: int
) -> WeightPair:
    """One slot's adapter in a layer as two float32 matrices, however many slices it has:
    `shrink` [in, ranks] (every slice's A, transposed, side by side) and `expand`
    [ranks, out] (each slice's B, transposed, on the block diagonal). `(x @ shrink) @
    expand` is every slice's delta side by side: a merged projection (qkv, gate_up) takes
    two products instead of two per slice, and each zero of the diagonal's off blocks adds
    exactly nothing to a finite product."""
    shrink = torch.cat([lora_a[slot, 0] for lora_a in lora_a_stacked])
    expand = torch.block_diag(*(lora_b[slot, 0] for lora_b in lora_b_stacked))
    return (
        shrink.to(torch.float32).t().contiguous(),
        expand.to(torch.float32).t().contiguous(),
    )


def weights_version(tensors: tuple[Tensor, ...]) -> tuple[int, ...] | None:
    """The tensors' version counters (each write into them counts), or None for tensors
    made in inference mode, which keep none."""
    try:
        return tuple(tensor._version for tensor in tensors)
    except RuntimeError:
        return None


class SlotMatmulPunicaWrapperCPU(PunicaWrapperCPU):
    """`PunicaWrapperCPU` whose linear-layer LoRA products run per adapter slot."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Per step, from the mapping: shared by every layer of the step.
        self._slot_groups: list[SlotTokens] = []
        # Per layer and slot: `slot_weights`, with the layer's weights' versions when they
        # were made. vLLM writes an adapter into its slot in place (`set_lora`, also to
        # reload one under its id), which moves the versions on.
        self._weights: dict[tuple[int, int], tuple[Tensor, tuple[int, ...], WeightPair]] = {}

    def update_metadata(
        self,
        mapping: Any,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        super().update_metadata(mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        self._slot_groups = tokens_by_slot(self.token_lora_indices)

    def computes(self, rows: int) -> bool:
        """Whether this step's grouping describes a layer input of `rows` tokens (never
        before the first step's mapping, when vLLM's count is None)."""
        return rows == self.indices_len[0]

    def merged_weights(
        self, lora_a_stacked: tuple[Tensor, ...], lora_b_stacked: tuple[Tensor, ...], slot: int
    ) -> WeightPair:
        """`slot_weights`, made again only once the layer's weights were written to (and
        every time where they keep no versions)."""
        layer = lora_a_stacked[0]
        versions = weights_version(lora_a_stacked + lora_b_stacked)
        cached = self._weights.get((id(layer), slot))
        if cached is not None and cached[0] is layer and versions and cached[1] == versions:
            return cached[2]
        weights = slot_weights(lora_a_stacked, lora_b_stacked, slot)
        if versions:
            self._weights[(id(layer), slot)] = (layer, versions, weights)
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
        # float32 products whatever the model's dtype, as vLLM's CPU ops compute them.
        x = x.to(torch.float32)
        for group in self._slot_groups:
            shrink, expand = self.merged_weights(lora_a_stacked, lora_b_stacked, group.slot)
            tokens = x if group.gather is None else x.index_select(0, group.gather)
            delta = ((tokens @ shrink) @ expand)[: group.count]
            if group.rows is None:
                y.add_(delta.to(y.dtype), alpha=scale)
            else:
                y.index_add_(0, group.rows, delta.to(y.dtype), alpha=scale)
        return None
