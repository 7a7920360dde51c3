"""workbench's multi-LoRA products for vLLM on the CPU against vLLM's own, on the same batch:
what every adapter's tokens get must not change, only how it is computed."""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")

from vllm.lora.layers.utils import LoRAMapping  # noqa: E402
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU  # noqa: E402
from vllm.v1.sample import sampler  # noqa: E402

from workbench.inference.cpu_lora import (  # noqa: E402
    BATCHED_ROWS,
    MIN_PRODUCT_ROWS,
    SlotMatmulPunicaWrapperCPU,
    plan_products,
)
from workbench.inference.eager_ranks import count_greater_or_equal  # noqa: E402

SLOTS, RANK, WIDTH = 4, 8, 48
# Three adapters in slots 0-2 (LoRA ids 11-13); slot 3 holds none.
SLOT_IDS = [11, 12, 13, None]


def _wrappers(token_ids: list[int], is_prefill: bool):
    mapping = LoRAMapping(token_ids, token_ids, is_prefill=is_prefill)
    wrappers = []
    for cls in (PunicaWrapperCPU, SlotMatmulPunicaWrapperCPU):
        wrapper = cls(max_num_batched_tokens=256, max_batches=64, device="cpu")
        # as vLLM's LoRA model manager calls it: its slots plus one
        wrapper.update_metadata(mapping, SLOT_IDS, SLOTS + 1, vocab_size=100)
        wrappers.append(wrapper)
    return wrappers


def _linear_lora(wrapper, x, lora_a, lora_b, output_slices):
    y = torch.ones(x.shape[0], sum(output_slices), dtype=x.dtype)
    wrapper.add_lora_linear(y, x, lora_a, lora_b, 0.5, output_slices)
    return y


# Prefill rows come in runs of one request's tokens; decode rows one per sequence. A step
# of one adapter's tokens only (a single run) takes the path without a gather.
STEPS = {
    "prefill": ([11] * 5 + [13] * 3 + [12] * 4 + [11] * 2, True),
    "decode": ([12, 11, 13, 11, 12], False),
    "one adapter": ([12] * 6, False),
}


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("output_slices", [(WIDTH,), (WIDTH, 16, 16)], ids=["one", "merged"])
def test_each_token_gets_its_own_adapters_delta_as_with_vllms_products(
    step, output_slices, monkeypatch
):
    generator = torch.Generator().manual_seed(0)
    token_ids, is_prefill = STEPS[step]
    x = torch.randn(len(token_ids), WIDTH, generator=generator)
    lora_a = tuple(torch.randn(SLOTS, 1, RANK, WIDTH, generator=generator) for _ in output_slices)
    lora_b = tuple(torch.randn(SLOTS, 1, n, RANK, generator=generator) for n in output_slices)
    vllm_wrapper, our_wrapper = _wrappers(token_ids, is_prefill)
    vllms = _linear_lora(vllm_wrapper, x, lora_a, lora_b, output_slices)
    # ours computes it: a mapping it does not understand would hand it to vLLM's path
    monkeypatch.setattr(PunicaWrapperCPU, "add_lora_linear", _not_vllms_path)
    ours = _linear_lora(our_wrapper, x, lora_a, lora_b, output_slices)
    torch.testing.assert_close(ours, vllms, rtol=1e-5, atol=1e-4)
    # and the delta is really there: not the untouched output
    assert (ours - 1).abs().amin(dim=1).gt(0).all()


def test_a_bfloat16_model_gets_vllms_deltas_to_bfloat16s_rounding(monkeypatch):
    # The output stays bfloat16, each value within one rounding step of vLLM's.
    generator = torch.Generator().manual_seed(3)
    token_ids, output_slices = [11] * 5 + [13] * 3 + [12] * 20, (WIDTH, 16, 16)
    x = torch.randn(len(token_ids), WIDTH, generator=generator).bfloat16()
    lora_a = tuple(torch.randn(SLOTS, 1, RANK, WIDTH, generator=generator) for _ in output_slices)
    lora_b = tuple(torch.randn(SLOTS, 1, n, RANK, generator=generator) for n in output_slices)
    lora_a, lora_b = (tuple(w.bfloat16() for w in ws) for ws in (lora_a, lora_b))
    vllm_wrapper, our_wrapper = _wrappers(token_ids, is_prefill=False)
    vllms = _linear_lora(vllm_wrapper, x, lora_a, lora_b, output_slices)
    monkeypatch.setattr(PunicaWrapperCPU, "add_lora_linear", _not_vllms_path)
    ours = _linear_lora(our_wrapper, x, lora_a, lora_b, output_slices)
    assert ours.dtype == torch.bfloat16
    # at most one bfloat16 step apart: 0.25 for the largest values here (32 to 64)
    assert (ours.float() - vllms.float()).abs().max() <= 0.25
    assert vllms.float().abs().max() < 64


def _not_vllms_path(*args, **kwargs):
    raise AssertionError("vLLM's own LoRA product ran")


def _plan(slots: list[int]):
    return [
        (
            b.slots.tolist(),
            b.width,
            None if b.gather is None else b.gather.tolist(),
            None if b.kept is None else b.kept.tolist(),
            None if b.rows is None else b.rows.tolist(),
        )
        for b in plan_products(torch.tensor(slots))
    ]


def test_every_slots_tokens_go_in_one_batched_product_padded_to_the_same_rows():
    m = MIN_PRODUCT_ROWS
    slots = [2, 0, -1] + [2] * (m - 1) + [0]
    twos = [i for i, slot in enumerate(slots) if slot == 2]
    zeros = [1, len(slots) - 1]
    # slot 0's two tokens padded with its last to m rows; slot 2's m tokens as they are
    ((batch_slots, width, gather, kept, rows),) = _plan(slots)
    assert (batch_slots, width) == ([0, 2], m)
    assert gather == zeros + [zeros[-1]] * (m - 2) + twos
    assert kept == [0, 1, *range(m, 2 * m)]
    assert rows == zeros + twos
    # one slot with every token, enough of them: the step's rows as they are
    assert _plan([3] * m) == [([3], m, None, None, None)]
    # too few: padded, and only the real rows kept
    assert _plan([3, 3]) == [([3], m, [0] + [1] * (m - 1), [0, 1], None)]
    assert _plan([-1, -1]) == []


def test_a_slot_with_far_more_tokens_than_the_others_is_multiplied_on_its_own():
    # a prompt's prefill beside decoding runs: padding the others to it would be waste
    m = MIN_PRODUCT_ROWS
    slots = [0] * m + [1] * m + [2] * (5 * m)
    batches = _plan(slots)
    assert [(b[0], b[1]) for b in batches] == [([0, 1], m), ([2], 5 * m)]
    assert batches[1][4] == list(range(2 * m, 7 * m))
    # slots with many tokens each: a product of their own pays its fixed cost once anyway
    many = BATCHED_ROWS + 1
    assert [(b[0], b[1]) for b in _plan([0] * many + [1] * many)] == [([0], many), ([1], many)]


def test_a_tokens_delta_is_bit_for_bit_the_same_however_many_tokens_its_adapter_has():
    # What a run's curve not depending on the other runs rests on: the same token through
    # the same adapter, as its adapter's only token in the step, among many of its
    # adapter's, alone in the step, beside other slots in one batched product, and in a
    # product of its own beside a slot with many more tokens.
    generator = torch.Generator().manual_seed(2)
    lora_a = (torch.randn(SLOTS, 1, RANK, WIDTH, generator=generator),)
    lora_b = (torch.randn(SLOTS, 1, WIDTH, RANK, generator=generator),)
    tokens = 3 * MIN_PRODUCT_ROWS
    x = torch.randn(tokens, WIDTH, generator=generator)
    steps = (
        [11] + [12] * (tokens - 1),
        [11] * tokens,
        [11] * 5 + [12] * 7 + [13] * (tokens - 12),
        [11] * 4 + [13] * 4 + [12] * (tokens - 8),
    )
    deltas = []
    for token_ids in steps:
        (_, ours) = _wrappers(token_ids, is_prefill=False)
        deltas.append(_linear_lora(ours, x, lora_a, lora_b, (WIDTH,))[0])
    for delta in deltas[1:]:
        assert torch.equal(delta, deltas[0])


def test_a_token_without_an_adapter_is_left_as_the_base_model_made_it():
    # LoRA id 0: a request for the base model, batched with an adapter's.
    token_ids = [11, 0, 11, 0]
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, WIDTH, generator=generator)
    lora_a = (torch.randn(SLOTS, 1, RANK, WIDTH, generator=generator),)
    lora_b = (torch.randn(SLOTS, 1, WIDTH, RANK, generator=generator),)
    vllms, ours = (
        _linear_lora(w, x, lora_a, lora_b, (WIDTH,)) for w in _wrappers(token_ids, False)
    )
    assert torch.equal(ours[[1, 3]], torch.ones(2, WIDTH))
    torch.testing.assert_close(ours[[0, 2]], vllms[[0, 2]], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("inference_mode", [False, True], ids=["versioned", "inference-mode"])
def test_an_adapter_written_into_its_slot_is_the_one_used_from_then_on(inference_mode):
    # vLLM writes each adapter into its slot in place, a reload under the same id too; the
    # merged weights made for the slot's previous adapter must not outlive it. Weights
    # made in inference mode keep no version counter, and are merged again every time.
    token_ids, output_slices = [11] * 20 + [12] * 20, (WIDTH, 16, 16)
    generator = torch.Generator().manual_seed(4)
    with torch.inference_mode(inference_mode):
        x = torch.randn(len(token_ids), WIDTH, generator=generator)
        lora_a = tuple(
            torch.randn(SLOTS, 1, RANK, WIDTH, generator=generator) for _ in output_slices
        )
        lora_b = tuple(torch.randn(SLOTS, 1, n, RANK, generator=generator) for n in output_slices)
        vllm_wrapper, our_wrapper = _wrappers(token_ids, is_prefill=False)
        before = _linear_lora(our_wrapper, x, lora_a, lora_b, output_slices)
        # slot 1's adapter (id 12) replaced, as `set_lora` does: its rows change, not slot 0's
        for weights in (*lora_a, *lora_b):
            weights[1].copy_(torch.randn(weights[1].shape, generator=generator))
        after = _linear_lora(our_wrapper, x, lora_a, lora_b, output_slices)
        vllms = _linear_lora(vllm_wrapper, x, lora_a, lora_b, output_slices)
    torch.testing.assert_close(after, vllms, rtol=1e-5, atol=1e-4)
    assert torch.equal(after[:20], before[:20])
    assert (after[20:] - before[20:]).abs().amax(dim=1).gt(1e-3).all()


@pytest.mark.parametrize(
    ("workbench_server", "kernel"),
    [(True, "slot-matmul"), (True, "vllm"), (False, "slot-matmul"), (False, None)],
)
def test_the_plugin_patches_vllm_only_in_a_server_workbench_started(
    workbench_server, kernel, monkeypatch
):
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.engine.logprobs import LogprobsProcessor

    from workbench.inference import vllm_plugin

    monkeypatch.setattr(CpuPlatform, "get_punica_wrapper", CpuPlatform.get_punica_wrapper)
    compiled_count = sampler.batched_count_greater_than
    monkeypatch.setattr(sampler, "batched_count_greater_than", compiled_count)
    monkeypatch.setattr(vllm.platforms, "current_platform", CpuPlatform())
    monkeypatch.setattr(
        LogprobsProcessor, "from_new_request", LogprobsProcessor.__dict__["from_new_request"]
    )
    if workbench_server:
        monkeypatch.setenv(vllm_plugin.SERVER_ENV, "1")
    else:
        monkeypatch.delenv(vllm_plugin.SERVER_ENV, raising=False)
    if kernel is None:
        monkeypatch.delenv(vllm_plugin.CPU_LORA_ENV, raising=False)
    else:
        monkeypatch.setenv(vllm_plugin.CPU_LORA_ENV, kernel)
    vllm_plugin.register()
    wrapper = CpuPlatform.get_punica_wrapper()
    if workbench_server and kernel == "slot-matmul":
        assert wrapper == "workbench.inference.cpu_lora.SlotMatmulPunicaWrapperCPU"
    else:
        assert wrapper == "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU"
    # The sampled tokens' ranks are counted eagerly in any server workbench started.
    ranks = count_greater_or_equal if workbench_server else compiled_count
    assert sampler.batched_count_greater_than is ranks
    # So are the log-probs of requests that ask for them as token ids.
    wrapped = getattr(LogprobsProcessor.from_new_request.__func__, "wraps_vllms", False)
    assert wrapped is workbench_server
