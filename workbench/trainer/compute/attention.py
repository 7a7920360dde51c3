"""Attention over a packed row: each sample attends to its own earlier tokens only.

(A row may also hold branches, completions that share the prompt of the sample before
them rather than repeat it: `PackedSequences`. Only "per_sample" and "dense" run those.)

The trainer packs many samples (of several runs) into one row of up to `seq_len` tokens. A
dense block-diagonal T x T mask would make attention cost quadratic in the row; the paths
here cost per sample and never build one:

- "per_sample": causal `scaled_dot_product_attention` within each sample, samples of similar
  length batched (right-padded) into one call. Exact on any device and dtype; the CPU's
  choice (torch has no CPU varlen kernel and no flex-attention backward on CPU).
- "varlen":     `torch.nn.attention.varlen.varlen_attn` (FlashAttention-2's varlen kernel in
  torch itself; CUDA, torch >= 2.10, bfloat16 or float16), called as the installed
  torch's signature allows.
- "flash":      `flash_attn_varlen_func` from the `flash-attn` package, where it is installed.
- "flex":       flex attention with a document-causal block mask built from the sample
  boundaries (`flex_mask.py`), compiled once for every row length (CUDA).
- "dense":      the explicit T x T block-diagonal mask through SDPA: quadratic, kept only
  as the reference that `workbench bench trainer` measures the others against.

Which path runs where is `attention_choice.py`'s business.

Each path is registered with Hugging Face's `AttentionInterface` under its own name, with a
mask function that builds nothing, so the model calls it in place of SDPA. The sample
boundaries reach it as the keyword argument `packed_sequences` of the model's forward,
which transformers passes down to every attention call; called without it, the model
treats each batch row as one unpadded sequence.

Host syncs: everything a kernel needs of the row (lengths, cu_seqlens, the longest sample,
the buckets, the block mask) is computed on the host once per row in `PackedSequences` and
copied to the device once; no decoder layer reads a device tensor back.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import PROMPT_SHARING_ATTENTION
from workbench.trainer.compute.flex_mask import document_causal_block_mask
from workbench.trainer.transfer import to_device

AttentionChoice = Literal["auto", "per_sample", "varlen", "flash", "flex", "dense"]
AttentionPath = Literal["per_sample", "varlen", "flash", "flex", "dense"]
ATTENTION_PATHS: tuple[AttentionPath, ...] = ("per_sample", "varlen", "flash", "flex", "dense")

_REGISTERED_PREFIX = "workbench_"

# A right-padded causal batch is exact for the real tokens (a query never sees the padding
# after it), to rounding: a padded sample's sums over its keys may round otherwise than its
# own length's. The padding costs time, at most 1 / 0.8^2 = 1.6x per bucket.
BUCKET_MIN_FILL = 0.8


# ---------------------------------------------------------------------------- sample boundaries


@dataclass
class PackedSequences:
    """Where each sample of a packed row starts and ends, in the forms the kernels want.

    A row is a run of segments, each a stretch of consecutive positions. A segment whose
    positions start at 0 is a sample. A segment whose positions start at p > 0 is a branch:
    a sample whose first p tokens are those of the last segment that started at 0, shared
    rather than repeated (the packer's `share_prompts`: the completions of one prompt).
    A branch's tokens attend to those p tokens and to its own earlier tokens.

    Built once per row (not per layer) from its position ids. The flex block mask and the
    dense mask are made on first use and then shared by every layer of the forward (and
    its recomputation under activation checkpointing).
    """

    lengths: tuple[int, ...]  # of each segment
    cu_seqlens: torch.Tensor  # int32 [N + 1] on the row's device
    max_length: int
    device: torch.device
    # Per segment, the row index where its shared tokens start and how many it has (0 for a
    # segment whose positions start at 0).
    shared_starts: tuple[int, ...]
    shared_lengths: tuple[int, ...]
    # Whether a segment shares tokens with an earlier one: a plain attribute, which a
    # compiled layer guards on as it is (a value read from the tuples above specialised the
    # graph on the row's segment count).
    has_branches: bool
    # "per_sample" pads a bucket's samples to its longest; a bucket holds samples of at least
    # this share of its longest. 1.0: every sample in a bucket of its own length, so a sample's
    # attention is computed exactly as alone, bit for bit (a Tinker pack, tinker_packing.py).
    bucket_min_fill: float = BUCKET_MIN_FILL
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_position_ids(
        cls,
        position_ids: torch.Tensor,
        device: torch.device | str,
        bucket_min_fill: float = BUCKET_MIN_FILL,
    ) -> PackedSequences:
        # The one host read of a row: position ids come from the packer on the host (a
        # device tensor here costs one sync per row, never one per layer).
        positions = position_ids.reshape(-1).cpu()
        if positions.numel() == 0:
            raise ValueError("a packed row needs at least one token")
        if int(positions[0]) != 0:
            raise ValueError("a packed row's position ids must start at 0")
        continues = positions[1:] == positions[:-1] + 1
        starts = [0, *(torch.nonzero(~continues).flatten() + 1).tolist(), positions.numel()]
        lengths = tuple(end - start for start, end in itertools.pairwise(starts))
        shared_starts, shared_lengths = [], []
        sample_start = sample_length = 0
        for start, length in zip(starts[:-1], lengths, strict=True):
            first = int(positions[start])
            if first == 0:
                sample_start, sample_length = start, length
            elif first > sample_length:
                raise ValueError(
                    f"a packed row's segment at token {start} starts at position {first}, but "
                    f"the sample it branches from has {sample_length} tokens"
                )
            shared_starts.append(sample_start)
            shared_lengths.append(first)
        device = torch.device(device)
        cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        return cls(
            lengths,
            to_device(cu_seqlens, device),
            max(lengths),
            device,
            tuple(shared_starts),
            tuple(shared_lengths),
            any(shared_lengths),
            bucket_min_fill,
        )

    @property
    def total_tokens(self) -> int:
        return int(sum(self.lengths))

    def build_for(self, path: AttentionPath) -> PackedSequences:
        """Build the tensors `path` reads, before the first layer runs (returns self).

        Built on first use inside a compiled layer, they were traced: a graph specialised
        on this row's sample lengths, and on CUDA a pinned copy dynamo cannot run ("NYI:
        aten._pin_memory", a dense row on an H100, torch 2.11).
        """
        if path == "dense":
            self.dense_mask()
        elif path == "flex":
            self.flex_block_mask()
        elif path == "per_sample":
            self.bucket_order()
        return self

    def sample_of_token(self) -> torch.Tensor:
        if "sample_of_token" not in self._cache:
            ids = torch.repeat_interleave(
                torch.arange(len(self.lengths)), torch.tensor(self.lengths)
            )
            self._cache["sample_of_token"] = to_device(ids, self.device)
        return self._cache["sample_of_token"]

    def length_buckets(self) -> list[LengthBucket]:
        """Samples grouped longest first into buckets of similar length (the shortest at
        least `bucket_min_fill` of the longest), for one padded attention call per bucket.
        A branch is its shared tokens and its own, whose outputs alone are kept."""
        if "buckets" not in self._cache:
            starts = itertools.accumulate(self.lengths[:-1], initial=0)
            sequences = [
                _Sequence(shared_start, shared, start, length)
                for shared_start, shared, start, length in zip(
                    self.shared_starts, self.shared_lengths, starts, self.lengths, strict=True
                )
            ]
            self._cache["buckets"] = _length_buckets(sequences, self.device, self.bucket_min_fill)
        return self._cache["buckets"]

    def bucket_order(self) -> torch.Tensor:
        """For each row position, where its token is in the buckets' concatenated output."""
        if "bucket_order" not in self._cache:
            flat_positions = torch.cat([b.positions for b in self.length_buckets()])
            order = torch.empty_like(flat_positions)
            order[flat_positions] = torch.arange(flat_positions.numel(), device=self.device)
            self._cache["bucket_order"] = order
        return self._cache["bucket_order"]

    def dense_mask(self) -> torch.Tensor:
        """[1, 1, T, T] bool, True where a token may attend: the quadratic reference."""
        if "dense_mask" not in self._cache:
            sample = self.sample_of_token()
            mask = (sample[:, None] == sample[None, :]).tril()
            if self.has_branches:  # a branch's tokens also see the tokens it shares
                lengths = torch.tensor(self.lengths)
                starts = torch.repeat_interleave(torch.tensor(self.shared_starts), lengths)
                ends = starts + torch.repeat_interleave(torch.tensor(self.shared_lengths), lengths)
                starts, ends = to_device(starts, self.device), to_device(ends, self.device)
                key = torch.arange(self.total_tokens, device=self.device)
                mask |= (key >= starts[:, None]) & (key < ends[:, None])
            self._cache["dense_mask"] = mask[None, None]
        return self._cache["dense_mask"]

    def flex_block_mask(self):
        if "flex_block_mask" not in self._cache:
            self._cache["flex_block_mask"] = document_causal_block_mask(
                self.lengths, self.sample_of_token()
            )
        return self._cache["flex_block_mask"]


@dataclass(frozen=True)
class LengthBucket:
    count: int  # samples
    longest: int  # tokens of the longest; the others are padded to it
    gather: torch.Tensor  # [count * longest] row position of each slot (pads: `_length_buckets`)
    real: torch.Tensor  # [tokens] the padded slots that hold real tokens, in sample order
    positions: torch.Tensor  # [tokens] their row positions, in the same order


@dataclass(frozen=True)
class _Sequence:
    """One attention sequence of a row: `shared` tokens from `shared_start` (a branch's
    shared tokens; 0 for a sample), then `length` tokens of its own from `start`."""

    shared_start: int
    shared: int
    start: int
    length: int

    @property
    def total(self) -> int:
        return self.shared + self.length


def _length_buckets(
    sequences: list[_Sequence], device: torch.device, min_fill: float
) -> list[LengthBucket]:
    order = sorted(range(len(sequences)), key=lambda i: -sequences[i].total)
    buckets = []
    while order:
        longest = sequences[order[0]].total
        members = [i for i in order if sequences[i].total >= min_fill * longest]
        order = order[len(members) :]
        gather = torch.zeros(len(members), longest, dtype=torch.long)
        real = torch.zeros(len(members), longest, dtype=torch.bool)
        for slot, index in enumerate(members):
            seq = sequences[index]
            gather[slot, : seq.shared] = torch.arange(seq.shared) + seq.shared_start
            gather[slot, seq.shared : seq.total] = torch.arange(seq.length) + seq.start
            # Pads copy the sequence's own last token, which no real token attends to
            # (right-padded, causal). Their gradient, 0 times the sequence's values, goes
            # back to that token: to the sample itself, never to another run's token (0 x
            # inf is nan where a diverged run's values are not finite).
            gather[slot, seq.total :] = seq.start + seq.length - 1
            # A branch's shared tokens are there to be attended to; their outputs are the
            # sample's they come from.
            real[slot, seq.shared : seq.total] = True
        buckets.append(
            LengthBucket(
                count=len(members),
                longest=longest,
                gather=to_device(gather.flatten(), device),
                real=to_device(torch.nonzero(real.flatten()).flatten(), device),
                positions=to_device(gather[real], device),
            )
        )
    return buckets


def packed_attention_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """The dense block-diagonal causal mask [1, 1, T, T] of a packed row (True = may attend).

    Quadratic in the row: a 4-D `attention_mask` for a model on its stock attention, as the
    tests run a packed row to compare with the samples run alone. The "dense" path builds
    the same mask itself (`PackedSequences.dense_mask`).
    """
    return PackedSequences.from_position_ids(position_ids, position_ids.device).dense_mask()


# ---------------------------------------------------------------------------- the kernels
#
# Each takes Hugging Face's attention-function arguments: query [1, Hq, T, D] and key and
# value [1, Hkv, T, D], and returns ([1, T, Hq, D], None).


def _expand_kv(tensor: torch.Tensor, groups: int, dim: int) -> torch.Tensor:
    return tensor if groups == 1 else tensor.repeat_interleave(groups, dim=dim)


def _groups(query: torch.Tensor, key: torch.Tensor, head_dim: int) -> int:
    return query.shape[head_dim] // key.shape[head_dim]


def _per_sample(query, key, value, packed: PackedSequences, scaling) -> torch.Tensor:
    groups = _groups(query, key, 1)
    key, value = _expand_kv(key, groups, 1), _expand_kv(value, groups, 1)
    heads, head_dim = query.shape[1], query.shape[3]
    outputs = []
    for bucket in packed.length_buckets():
        q, k, v = (_padded_batch(t, bucket) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
        flat = out.transpose(0, 1).reshape(heads, bucket.count * bucket.longest, head_dim)
        outputs.append(flat.index_select(1, bucket.real))
    # Buckets hold the samples longest first; put every token back in its row position.
    return torch.cat(outputs, dim=1).index_select(1, packed.bucket_order())[None].transpose(1, 2)


def _causal(query, key, value, scaling) -> torch.Tensor:
    groups = _groups(query, key, 1)
    key, value = _expand_kv(key, groups, 1), _expand_kv(value, groups, 1)
    out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    return out.transpose(1, 2)


def _padded_batch(tensor: torch.Tensor, bucket: LengthBucket) -> torch.Tensor:
    """[1, H, T, D] -> [samples, H, longest, D]: the bucket's samples, right-padded."""
    heads, head_dim = tensor.shape[1], tensor.shape[3]
    gathered = tensor[0].index_select(1, bucket.gather)
    return gathered.view(heads, bucket.count, bucket.longest, head_dim).transpose(0, 1)


def _dense(query, key, value, packed: PackedSequences, scaling) -> torch.Tensor:
    groups = _groups(query, key, 1)
    key, value = _expand_kv(key, groups, 1), _expand_kv(value, groups, 1)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=packed.dense_mask(), scale=scaling
    )
    return out.transpose(1, 2)


def _varlen(query, key, value, packed: PackedSequences, scaling) -> torch.Tensor:
    from torch.nn.attention import varlen

    # [1, H, T, D] -> [T, H, D], the layout of FlashAttention's varlen kernels.
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    options, query_factor = varlen_options(
        _parameters(varlen.varlen_attn),
        groups=_groups(q, k, 1),
        head_dim=q.shape[2],
        scaling=scaling,
    )
    if query_factor != 1.0:
        q = q * query_factor
    cu, longest = packed.cu_seqlens, packed.max_length
    return varlen.varlen_attn(q, k, v, cu, cu, longest, longest, **options)[None]


def varlen_options(
    parameters: frozenset[str], *, groups: int, head_dim: int, scaling: float | None
) -> tuple[dict[str, Any], float]:
    """Keyword arguments for causal attention through a `varlen_attn` that takes
    `parameters`, and the factor to scale the query by where it cannot take `scale`.

    torch 2.10: `(..., is_causal=False, return_aux=None)`, no scale; 2.11: keyword-only
    `return_aux`, `scale` and `window_size`, causal being `window_size=(-1, 0)`; later
    releases add `enable_gqa` and refuse fewer key/value heads without it. The kernel
    under all of them is FlashAttention-2's, which takes fewer key/value heads than query
    heads as they are, so the keys and values are never repeated to the query heads.
    """
    options: dict[str, Any] = {}
    if "is_causal" in parameters:
        options["is_causal"] = True
    elif "window_size" in parameters:
        options["window_size"] = (-1, 0)
    else:
        raise TypeError(
            f"torch's varlen_attn takes neither is_causal nor window_size: {parameters}"
        )
    if groups > 1 and "enable_gqa" in parameters:
        options["enable_gqa"] = True
    query_factor = 1.0
    default_scale = head_dim**-0.5
    if scaling is not None and not math.isclose(scaling, default_scale, rel_tol=1e-6):
        if "scale" in parameters:
            options["scale"] = scaling
        else:
            # Without `scale` the kernel uses 1 / sqrt(head_dim); scaling the query by the
            # ratio gives the same scores.
            query_factor = scaling / default_scale
    return options, query_factor


def _parameters(function) -> frozenset[str]:
    """The parameter names of `function`, read once per function object."""
    # A plain dict rather than functools.cache: torch.compile traces a dict lookup, where it
    # warns about an lru_cache wrapper and traces the signature inspection inside it.
    if function not in _PARAMETERS:
        _PARAMETERS[function] = frozenset(inspect.signature(function).parameters)
    return _PARAMETERS[function]


_PARAMETERS: dict[Any, frozenset[str]] = {}


def _flash(query, key, value, packed: PackedSequences, scaling) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    cu, longest = packed.cu_seqlens, packed.max_length
    out = flash_attn_varlen_func(
        q, k, v, cu, cu, longest, longest, softmax_scale=scaling, causal=True
    )
    return out[None]


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    # Dynamic shapes: one compilation serves every row length (and block-mask size). With
    # static shapes each new length recompiled, until dynamo's recompile limit sent flex
    # to its eager fallback, which builds the full score matrix.
    return torch.compile(flex_attention, dynamic=True)


def _flex(query, key, value, packed: PackedSequences, scaling) -> torch.Tensor:
    flex = _compiled_flex_attention()
    enable_gqa = query.shape[1] != key.shape[1]
    out = flex(
        query,
        key,
        value,
        block_mask=packed.flex_block_mask(),
        scale=scaling,
        enable_gqa=enable_gqa,
        kernel_options=_FLEX_TRAINING_KERNEL,
    )
    return out.transpose(1, 2)


# A row under 128 tokens would otherwise take flex's decoding kernel, meant for a few new
# queries against a long cache: on an H200 (torch 2.11) it had no kernel for a packed row's
# block mask and compilation failed ("NoValidChoicesError"). Rows of any length are the
# training kernel's work.
_FLEX_TRAINING_KERNEL = {"FORCE_USE_FLEX_ATTENTION": True}


_KERNELS = {
    "per_sample": _per_sample,
    "dense": _dense,
    "varlen": _varlen,
    "flash": _flash,
    "flex": _flex,
}


def packed_attention(
    path: AttentionPath,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    packed: PackedSequences,
    scaling: float | None,
) -> torch.Tensor:
    """Attention of a packed row by `path`: query [1, Hq, T, D], key and value [1, Hkv, T, D]
    -> [1, T, Hq, D]."""
    # The row's length is checked in eager mode only: traced, the sum of its sample lengths
    # specialised a compiled layer on how many samples the row has (one graph per count).
    if query.shape[0] != 1 or (
        not torch.compiler.is_compiling() and query.shape[2] != packed.total_tokens
    ):
        raise ValueError(
            f"a packed row is one sequence of {packed.total_tokens} tokens; "
            f"attention got query {tuple(query.shape)}"
        )
    if packed.has_branches and path not in PROMPT_SHARING_ATTENTION:
        # The per-sample buckets gather a branch's shared tokens, the dense mask lets it see
        # them; the other kernels know only where each sample starts.
        raise ValueError(
            f"attention {path!r} cannot run a row whose samples share their prompts; "
            f"share_prompts needs one of {sorted(PROMPT_SHARING_ATTENTION)}"
        )
    return _KERNELS[path](query, key, value, packed, scaling)


# ---------------------------------------------------------------------------- wiring into the model


def attention_implementation_name(path: AttentionPath) -> str:
    return _REGISTERED_PREFIX + path


def _attention_function(path: AttentionPath):
    def attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        packed_sequences: PackedSequences | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if packed_sequences is None:
            # Called as a plain causal LM (a check, a generation): every batch row is one
            # whole, unpadded sequence.
            return _causal(query, key, value, scaling), None
        return packed_attention(path, query, key, value, packed_sequences, scaling), None

    if path in EAGER_UNDER_COMPILE:
        return torch.compiler.disable(attention)
    return attention


# Paths whose attention call runs eagerly inside a compiled decoder layer. "per_sample" loops
# in Python over the row's length buckets: traced, a graph specialises on the row's bucket
# structure (how many buckets, their sizes), and recompiled for almost every row until
# dynamo's recompile limit sent the whole layer to eager. Called eagerly, the layer around
# it stays compiled (a graph before the attention and one after) and dynamo never reads the
# row's `PackedSequences`.
EAGER_UNDER_COMPILE: frozenset[AttentionPath] = frozenset({"per_sample"})


def _no_mask(*args: Any, **kwargs: Any) -> None:
    # The kernels know the samples from `packed_sequences`; a mask would be the T x T tensor
    # this module exists to avoid.
    return None


def use_packed_attention(model: nn.Module, path: AttentionPath) -> None:
    """Make every attention layer of `model` run `path` over packed rows."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    name = attention_implementation_name(path)
    AttentionInterface.register(name, _attention_function(path))
    AttentionMaskInterface.register(name, _no_mask)
    model.set_attn_implementation(name)
