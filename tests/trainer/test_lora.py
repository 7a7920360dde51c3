"""MultiLoRALinear: peft's numbers for one adapter, per-run routing, both compute paths."""

from __future__ import annotations

from pathlib import Path

import peft
import pytest
import torch
from peft.utils import get_peft_model_state_dict
from torch import nn

from tests.trainer.builders import (
    build_trainer,
    load_state_dict_for_run,
    packed_logits,
    tiny_causal_lm,
)
from workbench import run_control
from workbench.trainer.lora import (
    DEFAULT_TARGET_MODULES,
    MultiLoRALinear,
    grouped_mm_supported,
    set_lora_num_tokens,
)

PATHS = ["grouped", "plain"]
PEFT_PREFIX = "base_model.model."


def assert_close_relative(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-5):
    """Equal to `rtol` relative to the tensor's scale (elementwise relative error is
    meaningless for entries that are zero up to rounding)."""
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * max(scale, 1e-12))


def peft_twin(rank: int, alpha: float, family: str = "llama") -> peft.PeftModel:
    """The same tiny model with peft's LoRA, adapters made non-trivial (B random)."""
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(DEFAULT_TARGET_MODULES)
    )
    model = peft.get_peft_model(tiny_causal_lm(family, seed=0), config)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model


def peft_grads(model: peft.PeftModel) -> dict[str, torch.Tensor]:
    """peft's adapter gradients under our manager's names (`...q_proj.lora_A.weight`)."""
    return {
        name.removeprefix(PEFT_PREFIX).replace(".default", ""): param.grad
        for name, param in model.named_parameters()
        if "lora_" in name
    }


def our_grads(manager, idx: int) -> dict[str, torch.Tensor]:
    return {
        f"{name}.weight": param.grad for name, param in manager.get_named_parameters_for_run(idx)
    }


def random_layer(path: str) -> MultiLoRALinear:
    """16 -> 12 features, rank-4 slots; slot 2 runs at rank 2; every adapter non-zero."""
    torch.manual_seed(3)
    layer = MultiLoRALinear(nn.Linear(16, 12), rank=4, n_adapters=3, alpha=8.0, path=path)
    layer.set_adapter_config(2, rank=2, alpha=3.0)
    for idx in range(3):
        rank = layer.adapter_rank(idx)
        layer.load_state_dict_for_adapter(
            idx, {"lora_A.weight": torch.randn(rank, 16), "lora_B.weight": torch.randn(12, rank)}
        )
    return layer


# ---------------------------------------------------------------------------- against peft


@pytest.mark.parametrize(
    ("family", "path"),
    [("llama", "grouped"), ("llama", "plain"), ("qwen2", "auto"), ("qwen3", "auto")],
)
def test_one_adapter_matches_peft_outputs_and_gradients(tmp_path: Path, family: str, path: str):
    trainer = build_trainer(tmp_path / "exp", {"run_a": ""}, path=path, family=family)
    twin = peft_twin(rank=8, alpha=16.0, family=family)
    peft_state = get_peft_model_state_dict(twin)
    ours = trainer.manager.get_state_dict_for_run(0)
    assert {PEFT_PREFIX + key for key in ours} == set(peft_state)
    load_state_dict_for_run(
        trainer.manager, 0, {k.removeprefix(PEFT_PREFIX): v for k, v in peft_state.items()}
    )

    input_ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    probe = torch.randn(1, 12, 64, generator=torch.Generator().manual_seed(2))
    set_lora_num_tokens(trainer.model, [12])
    our_logits = trainer.model(input_ids=input_ids).logits
    peft_logits = twin(input_ids=input_ids).logits
    assert_close_relative(our_logits, peft_logits)

    (our_logits * probe).sum().backward()
    (peft_logits * probe).sum().backward()
    expected = peft_grads(twin)
    actual = our_grads(trainer.manager, 0)
    assert set(actual) == set(expected)
    for name, grad in expected.items():
        assert grad.abs().sum() > 0, name
        assert_close_relative(actual[name], grad)


@pytest.mark.parametrize("path", PATHS)
def test_run_with_smaller_rank_than_its_slot_matches_peft_at_that_rank(tmp_path: Path, path: str):
    trainer = build_trainer(
        tmp_path / "exp", {"run_small": "[lora]\nrank = 4\nalpha = 12.0\n"}, rank=8, path=path
    )
    twin = peft_twin(rank=4, alpha=12.0)  # scaling 3, the trainer's slots 16 / 8 = 2
    peft_state = get_peft_model_state_dict(twin)
    load_state_dict_for_run(
        trainer.manager, 0, {k.removeprefix(PEFT_PREFIX): v for k, v in peft_state.items()}
    )
    state = trainer.manager.get_state_dict_for_run(0)
    assert state["model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 32)
    assert state["model.layers.0.mlp.down_proj.lora_B.weight"].shape == (32, 4)

    input_ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(1))
    set_lora_num_tokens(trainer.model, [10])
    our_logits = trainer.model(input_ids=input_ids).logits
    peft_logits = twin(input_ids=input_ids).logits
    assert_close_relative(our_logits, peft_logits)

    our_logits.square().sum().backward()
    peft_logits.square().sum().backward()
    expected = peft_grads(twin)
    for name, param in trainer.manager.get_named_parameters_for_run(0):
        kept = param.grad[:4] if name.endswith("lora_A") else param.grad[:, :4]
        padding = param.grad[4:] if name.endswith("lora_A") else param.grad[:, 4:]
        assert_close_relative(kept, expected[f"{name}.weight"])
        assert torch.count_nonzero(padding) == 0, f"{name}: unused rank got a gradient"


# ---------------------------------------------------------------------------- routing


@pytest.mark.parametrize("path", PATHS)
def test_each_row_uses_only_its_runs_adapter(path: str):
    layer = random_layer(path)
    counts = [5, 0, 7]
    x = torch.randn(1, 12, 16)
    layer.routing.set_num_tokens(torch.tensor(counts))
    out = layer(x)[0]

    slot_of_row = [0] * 5 + [2] * 7
    for row, idx in enumerate(slot_of_row):
        rank = layer.adapter_rank(idx)
        lora_a, lora_b = layer.lora_A[idx][:rank], layer.lora_B[idx][:, :rank]
        expected = layer.base_layer(x[0, row]) + layer.adapter_scaling(idx) * (
            lora_b @ (lora_a @ x[0, row])
        )
        torch.testing.assert_close(out[row], expected, rtol=1e-5, atol=1e-6)

    with torch.no_grad():
        layer.lora_B[0].add_(1.0)
    changed = layer(x)[0]
    assert not torch.allclose(changed[:5], out[:5])
    torch.testing.assert_close(changed[5:], out[5:], rtol=0, atol=0)


def test_counts_that_do_not_cover_the_input_are_refused():
    layer = random_layer("plain")
    x = torch.randn(10, 16)
    with pytest.raises(RuntimeError, match="no token counts"):
        layer(x)
    layer.routing.set_num_tokens(torch.tensor([4, 0, 5]))
    with pytest.raises(ValueError, match="sums to 9 but the input has 10 tokens"):
        layer(x)
    with pytest.raises(ValueError, match="one count per adapter slot"):
        layer.routing.set_num_tokens(torch.tensor([4, 6]))


# ---------------------------------------------------------------------------- two paths


def forward_and_grads(layer: MultiLoRALinear, x: torch.Tensor, counts: list[int]):
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    layer.routing.set_num_tokens(torch.tensor(counts))
    out = layer(x)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    grads = [x.grad] + [
        p.grad if p.grad is not None else torch.zeros_like(p)
        for p in [*layer.lora_A, *layer.lora_B]
    ]
    return out.detach(), grads


def test_grouped_path_gives_the_plain_paths_outputs_and_gradients():
    layer = random_layer("plain")
    x = torch.randn(1, 40, 16)
    for counts in ([13, 0, 27], [0, 40, 0], [1, 38, 1]):
        layer.path = "plain"
        plain_out, plain_grads = forward_and_grads(layer, x, counts)
        layer.path = "grouped"
        grouped_out, grouped_grads = forward_and_grads(layer, x, counts)
        assert_close_relative(grouped_out, plain_out)
        for grouped, plain in zip(grouped_grads, plain_grads, strict=True):
            assert_close_relative(grouped, plain)


def test_grouped_path_gives_the_plain_paths_gradients_through_a_whole_model(tmp_path: Path):
    runs = {
        "run_a": "seed = 1",
        "run_b": "seed = 2\n[lora]\nrank = 4\n",
        "run_c": "seed = 3",
        "run_d": "seed = 4\n[lora]\nalpha = 4.0\n",
    }
    results = {}
    for path in PATHS:
        trainer = build_trainer(tmp_path / path, runs, path=path)
        generator = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for idx in range(4):
                for _, param in trainer.manager.get_named_parameters_for_run(idx):
                    param.add_(torch.randn(param.shape, generator=generator) * 0.05)
        samples = [torch.arange(9), torch.arange(5, 16), torch.arange(30, 44)]
        logits = packed_logits(trainer.model, samples, [9, 11, 0, 14])
        logits.square().mean().backward()
        grads = {
            name: param.grad if param.grad is not None else torch.zeros_like(param)
            for idx in range(4)
            for name, param in trainer.manager.get_named_parameters_for_run(idx)
        }
        results[path] = (logits.detach(), grads)
    assert_close_relative(results["grouped"][0], results["plain"][0])
    for name, grad in results["plain"][1].items():
        assert_close_relative(results["grouped"][1][name], grad)


def test_auto_path_takes_grouped_matmul_only_where_it_works_and_shapes_align():
    aligned = MultiLoRALinear(nn.Linear(16, 12), rank=4, n_adapters=2, alpha=8.0)
    x = torch.randn(3, 16)
    expected = "grouped" if grouped_mm_supported("cpu", torch.float32) else "plain"
    assert aligned.resolve_path(x) == expected
    # 10 float32 features are 40-byte rows: not a multiple of 16, so grouped_mm cannot run.
    unaligned = MultiLoRALinear(nn.Linear(10, 12), rank=4, n_adapters=2, alpha=8.0)
    assert unaligned.resolve_path(torch.randn(3, 10)) == "plain"
    forced = MultiLoRALinear(nn.Linear(10, 12), rank=4, n_adapters=2, alpha=8.0, path="plain")
    assert forced.resolve_path(torch.randn(3, 10)) == "plain"


# ---------------------------------------------------------------------------- model wiring


def test_apply_lora_wraps_every_projection_and_registers_it_under_its_module_path(
    tmp_path: Path,
):
    trainer = build_trainer(tmp_path / "exp", {"run_a": ""})
    projections = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    projections += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    expected = [f"model.layers.{layer}.{proj}" for layer in range(2) for proj in projections]
    assert sorted(trainer.lora_layers) == sorted(expected)
    assert sorted(trainer.manager.lora_modules) == sorted(expected)
    for name in expected:
        assert isinstance(trainer.model.get_submodule(name), MultiLoRALinear)

    trainable = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    state = trainer.manager.get_state_dict_for_run(0)
    assert set(state) == {f"{name}.lora_{ab}.weight" for name in expected for ab in "AB"}
    assert state["model.layers.1.self_attn.k_proj.lora_A.weight"].shape == (8, 32)
    assert state["model.layers.1.self_attn.k_proj.lora_B.weight"].shape == (16, 8)
    assert all(torch.count_nonzero(t) == 0 for k, t in state.items() if "lora_B" in k)


def test_a_run_asking_for_more_rank_than_the_slots_is_rejected_with_a_reason(tmp_path: Path):
    trainer = build_trainer(tmp_path / "exp", {"run_big": "[lora]\nrank = 16\n"}, rank=8)
    assert trainer.manager.idx_2_id == {}
    reason = run_control.read_validation_error(tmp_path / "exp" / "run_big")
    assert reason is not None and "lora.rank: rank 16" in reason and "at most 8" in reason


def test_a_runs_initial_adapter_depends_on_its_seed_not_on_its_slot(tmp_path: Path):
    alone = build_trainer(tmp_path / "alone", {"run_x": "seed = 5"})
    crowded = build_trainer(
        tmp_path / "crowded", {"run_first": "seed = 9", "run_x": "seed = 5"}, max_runs=3
    )
    assert crowded.slot("run_x") == 1
    x_alone = alone.manager.get_state_dict_for_run(alone.slot("run_x"))
    x_crowded = crowded.manager.get_state_dict_for_run(crowded.slot("run_x"))
    first = crowded.manager.get_state_dict_for_run(crowded.slot("run_first"))
    for key, tensor in x_alone.items():
        torch.testing.assert_close(x_crowded[key], tensor, rtol=0, atol=0)
    some_a = "model.layers.0.self_attn.q_proj.lora_A.weight"
    assert not torch.equal(first[some_a], x_alone[some_a])


def test_a_runs_state_dict_loads_back_and_a_wrong_shape_is_refused(tmp_path: Path):
    trainer = build_trainer(tmp_path / "exp", {"run_a": "[lora]\nrank = 4\n"})
    state = trainer.manager.get_state_dict_for_run(0)
    changed = {key: tensor + 1.0 for key, tensor in state.items()}
    load_state_dict_for_run(trainer.manager, 0, changed)
    for key, tensor in trainer.manager.get_state_dict_for_run(0).items():
        torch.testing.assert_close(tensor, changed[key], rtol=0, atol=0)

    key = "model.layers.0.self_attn.q_proj.lora_A.weight"
    with pytest.raises(ValueError, match="run rank 4"):
        load_state_dict_for_run(trainer.manager, 0, {**changed, key: torch.zeros(8, 32)})
