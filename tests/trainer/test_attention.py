"""Attention over packed rows: which path runs where, torch's varlen kernel across releases,
and flex attention's block mask and compilations."""

from __future__ import annotations

import functools
import itertools
import random

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from workbench.trainer.compute import attention
from workbench.trainer.compute.attention import PackedSequences, packed_attention
from workbench.trainer.compute.attention_choice import (
    AttentionRuntime,
    available_attention_paths,
    resolve_attention,
    torch_release,
)
from workbench.trainer.compute.flex_mask import document_causal_block_mask


def runtime(device="cuda", dtype=torch.bfloat16, version=(2, 11), flash=False, head_dim=64):
    return AttentionRuntime(device, dtype, version, flash, head_dim)


def packed_row(lengths) -> PackedSequences:
    positions = torch.cat([torch.arange(n) for n in lengths])
    return PackedSequences.from_position_ids(positions, "cpu")


def qkv(total, heads=4, kv_heads=2, head_dim=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(1, h, total, head_dim, generator=generator) for h in (heads, kv_heads, kv_heads)
    ]


# ---------------------------------------------------------------------------- the choice


def test_auto_attention_costs_per_sample_on_the_cpu_and_never_picks_the_dense_mask():
    here = AttentionRuntime.detect("cpu", torch.float32)
    assert resolve_attention("auto", here) == "per_sample"
    assert available_attention_paths(here) == ["per_sample", "dense"]


def test_auto_attention_on_cuda_in_float32_takes_flex_never_a_half_precision_kernel():
    float32 = runtime(dtype=torch.float32, flash=True)
    assert resolve_attention("auto", float32) == "flex"
    assert "varlen" not in available_attention_paths(float32)
    assert "flash" not in available_attention_paths(float32)


def test_auto_attention_on_cuda_in_half_precision_takes_torchs_varlen_from_torch_2_10():
    for dtype in (torch.bfloat16, torch.float16):
        assert resolve_attention("auto", runtime(dtype=dtype, version=(2, 10))) == "varlen"
    before_varlen = runtime(version=(2, 9), flash=True)
    assert resolve_attention("auto", before_varlen) == "flash"
    assert resolve_attention("auto", runtime(version=(2, 9))) == "flex"


def test_auto_attention_on_cuda_with_heads_too_small_for_flex_in_float32_runs_per_sample():
    assert resolve_attention("auto", runtime(dtype=torch.float32, head_dim=8)) == "per_sample"
    # torch's varlen kernel takes heads of 8 in half precision.
    assert resolve_attention("auto", runtime(head_dim=8)) == "varlen"


@pytest.mark.parametrize(
    ("choice", "where", "remedy"),
    [
        ("varlen", runtime(dtype=torch.float32), 'set trainer.dtype = "bfloat16"'),
        ("flash", runtime(dtype=torch.float32, flash=True), 'set trainer.dtype = "bfloat16"'),
        ("varlen", runtime(version=(2, 9)), r"needs torch >= 2.10 and this is torch 2.9"),
        ("flash", runtime(flash=False), r"pip install flash-attn"),
        ("flex", runtime(head_dim=8), r"heads of at least 16"),
        ("varlen", runtime(head_dim=12), r"head size divisible by 8"),
        ("varlen", runtime(device="cpu", dtype=torch.float32), r"need a CUDA device"),
        ("flex", runtime(device="cpu", dtype=torch.float32), r"no backward on this device"),
    ],
)
def test_an_attention_path_that_cannot_run_is_an_error_naming_the_key_and_what_to_do(
    choice, where, remedy
):
    auto = resolve_attention("auto", where)
    with pytest.raises(ValueError, match=rf"trainer.attention = '{choice}' cannot run") as error:
        resolve_attention(choice, where)
    assert remedy.replace("\\", "") in str(error.value)
    assert f'Set trainer.attention = "auto" (here: {auto!r})' in str(error.value)


def test_the_runtime_of_a_model_is_its_base_dtype_and_head_size_on_its_device():
    from tests.trainer.builders import tiny_causal_lm

    model = tiny_causal_lm(head_dim=16).to(torch.bfloat16)
    described = AttentionRuntime.of_model(model, "cpu")
    assert (described.device_type, described.dtype, described.head_dim) == (
        "cpu",
        torch.bfloat16,
        16,
    )
    assert described.torch_version == torch_release(torch.__version__)
    assert torch_release("2.11.0+cu128") == (2, 11) and torch_release("2.10.0a0") == (2, 10)


# ---------------------------------------------------------------------------- varlen
#
# Signature stand-ins of torch's `varlen_attn` in three releases, read from torch's own
# source: they take exactly those parameters and compute what FlashAttention-2's kernel
# computes for them (per sample SDPA), so the call the trainer builds for each is checked
# both for its arguments and for its result.


def varlen_attn_signature_of_torch_2_10(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None
):
    return _varlen_semantics(query, key, value, cu_seq_q, causal=is_causal, scale=None)


def varlen_attn_signature_of_torch_2_11(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
    window_size=(-1, -1),
):  # fmt: skip
    causal = window_size == (-1, 0)
    return _varlen_semantics(query, key, value, cu_seq_q, causal=causal, scale=scale)


def varlen_attn_signature_of_torch_2_13(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
    window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None,
):  # fmt: skip
    if not enable_gqa and query.shape[1] != key.shape[1]:
        raise ValueError("Expect query and key/value to have the same number of heads")
    causal = window_size == (-1, 0)
    return _varlen_semantics(query, key, value, cu_seq_q, causal=causal, scale=scale)


def _varlen_semantics(query, key, value, cu_seq, *, causal, scale):
    """[T, H, D] in, [T, Hq, D] out: attention within each cu_seq segment, key and value
    heads shared by groups of query heads (FlashAttention-2 takes them so)."""
    outputs = []
    for start, end in itertools.pairwise(cu_seq.tolist()):
        q, k, v = (t[start:end].transpose(0, 1)[None] for t in (query, key, value))
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, enable_gqa=True
        )
        outputs.append(out[0].transpose(0, 1))
    return torch.cat(outputs)


def recording(stand_in):
    """`stand_in` with the same signature (inspect follows __wrapped__), recording each call's
    keyword arguments and key heads."""
    calls: list[dict] = []

    @functools.wraps(stand_in)
    def varlen_attn(query, key, value, *args, **kwargs):
        calls.append({"kwargs": kwargs, "key_heads": key.shape[1]})
        return stand_in(query, key, value, *args, **kwargs)

    return varlen_attn, calls


@pytest.mark.parametrize(
    ("stand_in", "causal_options", "takes_scale"),
    [
        (varlen_attn_signature_of_torch_2_10, {"is_causal": True}, False),
        (varlen_attn_signature_of_torch_2_11, {"window_size": (-1, 0)}, True),
        (varlen_attn_signature_of_torch_2_13, {"window_size": (-1, 0), "enable_gqa": True}, True),
    ],
)
@pytest.mark.parametrize("scaling", ["default", 0.3])
def test_varlen_is_called_as_the_installed_torchs_signature_allows_and_attends_causally(
    monkeypatch, stand_in, causal_options, takes_scale, scaling
):
    import torch.nn.attention.varlen

    varlen_attn, calls = recording(stand_in)
    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", varlen_attn)
    lengths = (5, 9, 1, 7)
    packed = packed_row(lengths)
    query, key, value = qkv(sum(lengths), heads=4, kv_heads=2, head_dim=16)
    scale = 16**-0.5 if scaling == "default" else scaling

    out = packed_attention("varlen", query, key, value, packed, scale)

    # Where the kernel takes no `scale`, a custom one is applied to the query instead.
    expected = packed_attention("per_sample", query, key, value, packed, scale)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    (call,) = calls
    passes_scale = takes_scale and scaling != "default"
    assert call["kwargs"] == causal_options | ({"scale": scale} if passes_scale else {})
    assert call["key_heads"] == 2, "keys and values go to the kernel with their own heads"


def test_varlen_reads_the_signature_once_per_function():
    first, _ = recording(varlen_attn_signature_of_torch_2_10)
    second, _ = recording(varlen_attn_signature_of_torch_2_11)
    assert attention._parameters(first) is attention._parameters(first)
    assert "is_causal" in attention._parameters(first)
    assert "window_size" in attention._parameters(second)


# ---------------------------------------------------------------------------- flex


def reference_block_mask(lengths):
    from torch.nn.attention.flex_attention import create_block_mask

    sample = packed_row(lengths).sample_of_token()

    def document_causal(batch, head, q_idx, kv_idx):
        return (sample[q_idx] == sample[kv_idx]) & (q_idx >= kv_idx)

    total = sum(lengths)
    return create_block_mask(document_causal, None, None, total, total, device="cpu")


def test_flex_block_mask_from_sample_boundaries_is_the_one_create_block_mask_evaluates():
    rng = random.Random(0)
    rows = [(1,), (128,), (128, 128), (3, 125, 256, 1), (130, 126, 300)]
    rows += [tuple(rng.randint(1, 400) for _ in range(rng.randint(1, 12))) for _ in range(20)]
    for lengths in rows:
        packed = packed_row(lengths)
        ours = document_causal_block_mask(lengths, packed.sample_of_token())
        reference = reference_block_mask(lengths)
        assert torch.equal(ours.to_dense(), reference.to_dense()), lengths
        # Full blocks skip the mask function: ours are exactly torch's.
        assert torch.equal(ours.full_kv_num_blocks, reference.full_kv_num_blocks), lengths
        assert torch.equal(ours.kv_num_blocks, reference.kv_num_blocks), lengths


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operation returns while active."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.numel = max(self.numel, tensor.numel())
        return out


def test_flex_block_mask_of_a_16k_row_never_holds_a_tensor_quadratic_in_the_row():
    lengths = (300,) * 54 + (184,)  # 16,384 tokens
    total = sum(lengths)
    blocks = total // 128
    packed = packed_row(lengths)
    with LargestTensor() as largest:
        mask = document_causal_block_mask(lengths, packed.sample_of_token())
    assert mask.shape == (1, 1, total, total)
    # The token-level tensors and the [Q blocks, KV blocks] tables BlockMask holds anyway
    # (its transposed tables have a column more); create_block_mask run eagerly makes
    # T x T = 268M.
    assert largest.numel <= 2 * max(total, blocks * blocks)


def test_flex_compiles_once_for_rows_of_eight_different_lengths_and_matches_per_sample():
    # On the CPU flex runs forward only (no backward there); the compilation is the same
    # dynamo decision as on CUDA. Half a minute of compiling on two cores.
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    attention._compiled_flex_attention.cache_clear()
    counters.clear()
    rng = random.Random(1)
    for total in (300, 517, 640, 901, 1024, 1333, 1800, 2047):
        cuts = sorted(rng.sample(range(1, total), 4))
        lengths = tuple(b - a for a, b in itertools.pairwise([0, *cuts, total]))
        packed = packed_row(lengths)
        query, key, value = qkv(total, heads=4, kv_heads=2, head_dim=16, seed=total)
        with torch.no_grad():
            out = packed_attention("flex", query, key, value, packed, 0.25)
            expected = packed_attention("per_sample", query, key, value, packed, 0.25)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5, msg=str(lengths))
    assert 1 <= counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


@pytest.mark.parametrize("bad_sample", [0, 1])
def test_a_sample_that_is_not_finite_sends_no_gradient_to_the_other_samples_of_its_row(
    bad_sample: int,
):
    # Samples of 5 and 4 tokens share one padded batch; the shorter one is padded. A diverged
    # run's sample holds inf: the others' gradients must stay what they would be without it.
    lengths = [5, 4]
    packed = packed_row(lengths)
    assert len(packed.length_buckets()) == 1, "one padded batch for both samples"
    query, key, value = qkv(sum(lengths))
    bounds = [(0, 5), (5, 9)]
    start, end = bounds[bad_sample]
    with torch.no_grad():
        for tensor in (query, key, value):
            tensor[:, :, start:end] = torch.inf
    for tensor in (query, key, value):
        tensor.requires_grad_()
    out = packed_attention("per_sample", query, key, value, packed, None)
    good_start, good_end = bounds[1 - bad_sample]
    out[:, good_start:good_end].square().sum().backward()
    for tensor in (query, key, value):
        assert torch.isfinite(tensor.grad[:, :, good_start:good_end]).all()
