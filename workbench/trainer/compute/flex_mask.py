"""The flex-attention block mask of a packed row, built from where its samples start.

torch's `create_block_mask` evaluates the mask function at every (query, key) pair; run
uncompiled (its default) that is a dense [B, H, T, T] boolean mask and its block sums: on the
CPU 2.5 GiB more peak memory at 16k tokens, and at 64k a 32 GiB allocation that fails (this
builder: 1.2 and 16 MiB). A packed
row's mask is document-causal, so its blocks follow from the sample boundaries alone: query
block i sees key blocks from the one holding the start of its first token's sample up to
itself, and a key block is full (every pair allowed, no mask function needed) when it lies
wholly inside the sample of block i's last token and before block i. That is O(T) work on
the tokens plus the [Q blocks, KV blocks] tables every BlockMask holds anyway
((T / 128)^2 entries: 16k at 16k tokens).
"""

from __future__ import annotations

import torch

# flex attention's default (and the Triton kernel's) tile: 128 queries by 128 keys.
FLEX_BLOCK_SIZE = 128


def document_causal_block_mask(
    lengths: tuple[int, ...], sample_of_token: torch.Tensor, block_size: int = FLEX_BLOCK_SIZE
):
    """A `BlockMask` for a row of samples of `lengths`: each token sees its own sample's
    earlier tokens. `sample_of_token` [T] (on the row's device) is what the kernel's mask
    function reads inside the blocks that are only partly allowed."""
    from torch.nn.attention.flex_attention import BlockMask

    sizes = torch.tensor(lengths)
    total = int(sizes.sum())
    sample = torch.repeat_interleave(torch.arange(len(lengths)), sizes)
    sample_start = sizes.cumsum(0) - sizes
    blocks = torch.arange((total + block_size - 1) // block_size)
    first_query = blocks * block_size
    last_query = (first_query + block_size - 1).clamp(max=total - 1)
    # Key blocks from the one where the sample of the block's first query begins ...
    first_key_block = sample_start[sample[first_query]] // block_size
    # ... and, from the first key block wholly inside the sample of its last query, full.
    first_full_block = (sample_start[sample[last_query]] + block_size - 1) // block_size
    query_block, key_block = blocks[:, None], blocks[None, :]
    seen = (key_block >= first_key_block[:, None]) & (key_block <= query_block)
    # A short last query block stays partial, as in create_block_mask: its padded rows
    # are masked by the mask function, not by the kernel's bounds.
    complete = (last_query - first_query + 1 == block_size)[:, None]
    full = seen & (key_block >= first_full_block[:, None]) & (key_block < query_block) & complete
    partial = seen & ~full
    device = sample_of_token.device

    def document_causal(batch, head, query_index, key_index):
        same_sample = sample_of_token[query_index] == sample_of_token[key_index]
        return same_sample & (query_index >= key_index)

    return BlockMask.from_kv_blocks(
        *_block_table(partial, device),
        *_block_table(full, device),
        BLOCK_SIZE=block_size,
        mask_mod=document_causal,
        seq_lengths=(total, total),
    )


def _block_table(blocks: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[Q blocks, KV blocks] bool -> (count per query block, key block indices listed first)
    with batch and head dimensions of 1, the layout of BlockMask."""
    counts = blocks.sum(-1, dtype=torch.int32)
    indices = torch.argsort(~blocks, dim=-1, stable=True).to(torch.int32)
    return counts[None, None].to(device), indices[None, None].to(device)
