"""workbench's multi-LoRA products for vLLM on the CPU against vLLM's own, on the same batch:
what every adapter's tokens get must not change, only how it is computed."""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")

from vllm.lora.layers.utils import LoRAMapping  # noqa: E402
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU  # noqa: E402

from workbench.inference.cpu_lora import SlotMatmulPunicaWrapperCPU  # noqa: E402

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
    y = torch.ones(x.shape[0], sum(output_slices))
    wrapper.add_lora_linear(y, x, lora_a, lora_b, 0.5, output_slices)
    return y


@pytest.mark.parametrize("is_prefill", [True, False], ids=["prefill", "decode"])
@pytest.mark.parametrize("output_slices", [(WIDTH,), (WIDTH, 16, 16)], ids=["one", "merged"])
def test_each_token_gets_its_own_adapters_delta_as_with_vllms_products(is_prefill, output_slices):
    generator = torch.Generator().manual_seed(0)
    # Prefill rows come in runs of one request's tokens; decode rows one per sequence.
    token_ids = [11] * 5 + [13] * 3 + [12] * 4 + [11] * 2 if is_prefill else [12, 11, 13, 11, 12]
    x = torch.randn(len(token_ids), WIDTH, generator=generator)
    lora_a = tuple(torch.randn(SLOTS, 1, RANK, WIDTH, generator=generator) for _ in output_slices)
    lora_b = tuple(torch.randn(SLOTS, 1, n, RANK, generator=generator) for n in output_slices)
    vllm_wrapper, our_wrapper = _wrappers(token_ids, is_prefill)
    # ours computes it (a mapping it does not understand would hand it to vLLM's path)
    assert our_wrapper._one_hot_for(len(token_ids), SLOTS, torch.float32) is not None
    vllms, ours = (
        _linear_lora(w, x, lora_a, lora_b, output_slices) for w in (vllm_wrapper, our_wrapper)
    )
    torch.testing.assert_close(ours, vllms, rtol=1e-5, atol=1e-4)
    # and the delta is really there: not the untouched output
    assert (ours - 1).abs().amin(dim=1).gt(0).all()


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


@pytest.mark.parametrize("kernel", ["slot-matmul", "vllm", None])
def test_the_plugin_swaps_the_cpu_lora_wrapper_only_in_a_server_workbench_started(
    kernel, monkeypatch
):
    from vllm.platforms.cpu import CpuPlatform

    from workbench.inference import vllm_plugin

    monkeypatch.setattr(CpuPlatform, "get_punica_wrapper", CpuPlatform.get_punica_wrapper)
    monkeypatch.setattr(vllm.platforms, "current_platform", CpuPlatform())
    if kernel is None:
        monkeypatch.delenv(vllm_plugin.CPU_LORA_ENV, raising=False)
    else:
        monkeypatch.setenv(vllm_plugin.CPU_LORA_ENV, kernel)
    vllm_plugin.register()
    wrapper = CpuPlatform.get_punica_wrapper()
    if kernel == "slot-matmul":
        assert wrapper == "workbench.inference.cpu_lora.SlotMatmulPunicaWrapperCPU"
    else:
        assert wrapper == "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU"
