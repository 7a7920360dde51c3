"""vLLM's multi-LoRA product on the CPU as two matrix products per slice, not one per token.

vLLM's CPU wrapper (`PunicaWrapperCPU`, through `vllm.lora.ops.torch_ops`) gathers every
token's own copy of its adapter's matrices (`lora_b_weights[token_indices]`, T x out x r
floats) and multiplies them one token at a time (`einsum("bi,boi->bo")`). With many
sequences in a batch that copy is most of a decode step: on the built-in model, 4 runs of
128 completions, the LoRA layers took 44 % of vLLM's worker thread and the base model's own
products 9 % (py-spy, vLLM 0.32 CPU).

Here every slot's product is computed for every token in one product, and each token keeps
its own slot's rows:

    shrink:  h = (x @ [A_0; ...; A_{L-1}]^T)[t, slot(t)]            x [T, in] -> h [T, r]
    expand:  y += [0 .. h_t at slot(t) .. 0] @ [B_0^T; ...; B_{L-1}^T]    h [T, r] -> [T, out]

That is L times the multiply-adds of the per-token form, and the LoRA share of a layer stays
small (rank x slots against the layer's width), but it reads each weight once per step
instead of once per token. A token with no adapter (slot -1) gets no delta, as on the GPU
(vLLM's CPU ops would index the last slot with it).

Only the linear layers' `add_shrink` and `add_expand` change; embeddings and logits keep
vLLM's path, and so does any call whose token count does not match the mapping.
`workbench.inference.vllm_plugin` puts this class in vLLM's place where workbench starts it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU


class SlotMatmulPunicaWrapperCPU(PunicaWrapperCPU):
    """`PunicaWrapperCPU` whose linear-layer LoRA products read each adapter weight once."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Per step, from the mapping: [T, slots], 1 in each token's slot, a zero row for a
        # token without one. Shared by every layer of the step.
        self._slot_one_hot: Tensor | None = None

    def update_metadata(
        self,
        mapping: Any,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        super().update_metadata(mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        slots = self.token_lora_indices
        one_hot = torch.zeros(slots.shape[0], max_loras, dtype=torch.float32, device=slots.device)
        has_slot = slots >= 0
        one_hot[has_slot, slots[has_slot]] = 1.0
        self._slot_one_hot = one_hot

    def _one_hot_for(self, rows: int, slot_count: int, dtype: torch.dtype) -> Tensor | None:
        """This step's one-hot slots for weights of `slot_count` slots, or None where they do
        not describe these rows (vLLM's own path then runs)."""
        one_hot = self._slot_one_hot
        # vLLM passes one more than its adapter slots as `max_loras` (the extra index means
        # "no adapter" in its sampler's padded indices); a token's slot is always below it.
        if one_hot is None or one_hot.shape[0] != rows or one_hot.shape[1] < slot_count:
            return None
        return one_hot[:, :slot_count].to(dtype)

    def add_shrink(
        self,
        y: tuple[Tensor, ...] | Tensor,
        x: Tensor,
        lora_a_stacked: tuple[Tensor, ...],
        scale: float,
        **kwargs: Any,
    ) -> None:
        x = x.view(-1, x.shape[-1])
        slot_count, rank, width = (lora_a_stacked[0].shape[i] for i in (0, -2, -1))
        one_hot = self._one_hot_for(x.shape[0], slot_count, y[0].dtype)
        if one_hot is None:
            return super().add_shrink(y, x, lora_a_stacked, scale, **kwargs)
        x = x.to(one_hot.dtype)
        for out, lora_a in zip(y, lora_a_stacked, strict=True):
            every_slot = x @ lora_a.reshape(slot_count * rank, width).to(one_hot.dtype).t()
            own_slot = (every_slot.view(-1, slot_count, rank) * one_hot.unsqueeze(2)).sum(1)
            # vLLM's ops assign here rather than add (the buffers arrive zeroed).
            torch.mul(own_slot, scale, out=out.view(-1, out.shape[-1])[:, :rank])
        return None

    def add_expand(
        self,
        y: Tensor,
        x: tuple[Tensor, ...] | Tensor,
        lora_b_stacked: tuple[Tensor, ...],
        output_slices: tuple[int, ...],
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        flat_y = y.view(-1, y.shape[-1])
        slot_count, rank = lora_b_stacked[0].shape[0], lora_b_stacked[0].shape[-1]
        one_hot = self._one_hot_for(flat_y.shape[0], slot_count, flat_y.dtype)
        if one_hot is None:
            return super().add_expand(
                y, x, lora_b_stacked, output_slices, offset_start, add_inputs, **kwargs
            )
        offset = offset_start
        for hidden, lora_b, width in zip(x, lora_b_stacked, output_slices, strict=True):
            hidden = hidden.view(-1, hidden.shape[-1])[:, :rank].to(one_hot.dtype)
            # Each token's rank-r row in its slot's columns, zeros in the others'.
            spread = (hidden.unsqueeze(1) * one_hot.unsqueeze(2)).view(hidden.shape[0], -1)
            # [slots, out, r] -> [slots * r, out]: every slot's B^T, stacked (a copy).
            stacked_b_t = (
                lora_b.reshape(slot_count, -1, rank).transpose(1, 2).reshape(slot_count * rank, -1)
            ).to(one_hot.dtype)
            delta = spread @ stacked_b_t
            common = min(width, delta.shape[1])
            target = flat_y[:, offset : offset + common]
            if add_inputs:
                target += delta[:, :common]
            else:
                target.copy_(delta[:, :common])
            offset += width
        return None
