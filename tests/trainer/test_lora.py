"""MultiLoRALinear: peft's numbers for one adapter, per-run routing, both compute paths."""

from __future__ import annotations

import logging
from pathlib import Path

import peft
import pytest
import torch
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file
from torch import nn
from torch._dynamo.testing import CompileCounter

from tests.trainer.builders import (
    DEVICE_DTYPES,
    build_trainer,
    load_adapter_into_slot,
    load_state_dict_for_run,
    packed_logits,
    tiny_causal_lm,
)
from workbench.files import run_control
from workbench.trainer.lora import layer as lora
from workbench.trainer.lora import ops as lora_ops
from workbench.trainer.lora.layer import (
    DEFAULT_TARGET_MODULES,
    MultiLoRALinear,
    set_lora_num_tokens,
)
from workbench.trainer.lora.ops import grouped_mm_problem
from workbench.trainer.runs.broadcast import write_adapter
from workbench.trainer.runs.checkpoint import RunCheckpointer

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


RANDOM_LAYER_RANKS = (8, 8, 2)  # slot 2 runs at a rank below the slot's


def random_layer(
    path: str, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> MultiLoRALinear:
    """16 -> 24 features, rank-8 slots; slot 2 runs at rank 2; every adapter non-zero.
    (Shapes 16-byte aligned in bf16 too, as torch._grouped_mm needs.)"""
    torch.manual_seed(3)
    base = nn.Linear(16, 24).to(device, dtype)
    layer = MultiLoRALinear(base, rank=8, n_adapters=3, alpha=8.0, path=path)
    layer.set_adapter_config(2, rank=2, alpha=3.0)
    for idx, rank in enumerate(RANDOM_LAYER_RANKS):
        load_adapter_into_slot(layer, idx, torch.randn(rank, 16), torch.randn(24, rank))
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
        trainer.model, 0, {k.removeprefix(PEFT_PREFIX): v for k, v in peft_state.items()}
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
        trainer.model, 0, {k.removeprefix(PEFT_PREFIX): v for k, v in peft_state.items()}
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
        rank = RANDOM_LAYER_RANKS[idx]
        lora_a, lora_b = layer.lora_A[idx][:rank], layer.lora_B[idx][:, :rank]
        expected = layer.base_layer(x[0, row]) + layer.adapter_scaling(idx) * (
            lora_b @ (lora_a @ x[0, row])
        )
        torch.testing.assert_close(out[row], expected)

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
    layer.routing.set_num_tokens(torch.tensor(counts), x.device)
    out = layer(x)
    out.backward(torch.linspace(-1, 1, out.numel(), device=x.device).view_as(out).to(out.dtype))
    grads = [x.grad] + [
        p.grad if p.grad is not None else torch.zeros_like(p)
        for p in [*layer.lora_A, *layer.lora_B]
    ]
    return out.detach(), grads


@pytest.mark.parametrize("kernel", ["grouped", "per_run_loop"])
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_every_lora_kernel_gives_the_plain_paths_outputs_and_gradients(device, dtype, kernel):
    if kernel == "grouped" and device == "cpu" and grouped_mm_problem(device, dtype):
        pytest.skip(grouped_mm_problem(device, dtype))
    layer = random_layer("plain", device, dtype)
    x = torch.randn(1, 40, 16, device=device, dtype=dtype)
    # bf16 products differ in rounding from one summation order to another.
    rtol = 1e-5 if dtype == torch.float32 else 2e-2
    for counts in ([13, 0, 27], [0, 40, 0], [1, 38, 1]):
        layer.path = "plain"
        plain_out, plain_grads = forward_and_grads(layer, x, counts)
        layer.path = kernel
        layer.select_compute(x.device, dtype)
        out, grads = forward_and_grads(layer, x, counts)
        assert_close_relative(out, plain_out, rtol)
        for ours, plain in zip(grads, plain_grads, strict=True):
            assert ours.dtype == plain.dtype
            assert_close_relative(ours, plain, rtol)


@pytest.mark.parametrize("kernel", ["grouped", "per_run_loop"])
def test_a_row_multiplies_only_its_runs_adapters_with_the_bits_of_the_product_over_all_slots(
    kernel,
):
    # A run's curve must not depend on which other runs share its rows: the row's tokens
    # get bit for bit what the product over every slot (a compiled graph's) gives them.
    if kernel == "grouped" and grouped_mm_problem("cpu", torch.float32):
        pytest.skip(grouped_mm_problem("cpu", torch.float32))
    layer = random_layer(kernel)
    layer.select_compute(torch.device("cpu"), torch.float32)
    x = torch.randn(1, 40, 16)
    counts = [13, 0, 27]
    out, grads = forward_and_grads(layer, x, counts)
    assert layer.lora_A[1].grad is None and layer.lora_B[1].grad is None  # never multiplied

    layer.zero_grad(set_to_none=True)
    every_slot_x = x.clone().requires_grad_()
    grouped_mm = kernel == "grouped"
    every_slot = layer.base_layer(every_slot_x) + lora_ops.multi_lora(
        every_slot_x.view(-1, 16),
        torch.stack(tuple(layer.lora_A)),
        torch.stack(tuple(layer.lora_B)) * layer.rank_scaling[:, None],
        layer.routing.offsets(grouped_mm, x.device),
        grouped_mm,
    ).view(1, 40, -1)
    every_slot.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    assert torch.equal(out, every_slot.detach())
    # (slot 1's gradients: None here, read as zeros; zeros from the product over all slots)
    every_slot_grads = [every_slot_x.grad] + [p.grad for p in [*layer.lora_A, *layer.lora_B]]
    for ours, theirs in zip(grads, every_slot_grads, strict=True):
        assert torch.equal(ours, theirs)


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
    cpu = torch.device("cpu")
    aligned = MultiLoRALinear(nn.Linear(16, 12), rank=4, n_adapters=2, alpha=8.0)
    expected = "per_run_loop" if grouped_mm_problem("cpu", torch.float32) else "grouped"
    assert aligned.select_compute(cpu, torch.float32) == expected
    # 10 float32 features are 40-byte rows: not a multiple of 16, so grouped_mm cannot run.
    unaligned = MultiLoRALinear(nn.Linear(10, 12), rank=4, n_adapters=2, alpha=8.0)
    assert unaligned.select_compute(cpu, torch.float32) == "per_run_loop"
    assert "'in': 10" in unaligned.compute_reason
    forced = MultiLoRALinear(nn.Linear(10, 12), rank=4, n_adapters=2, alpha=8.0, path="plain")
    assert forced.select_compute(cpu, torch.float32) == "plain"


@pytest.fixture
def fresh_lora_decisions():
    """The kernel decision and its warning are made once per process; these tests redo them."""
    lora_ops.grouped_mm_problem.cache_clear()
    lora._warn_once.cache_clear()
    yield
    lora_ops.grouped_mm_problem.cache_clear()
    lora._warn_once.cache_clear()


@pytest.mark.parametrize(
    ("capability", "dtype"),
    [((9, 0), torch.float32), ((8, 0), torch.bfloat16), ((12, 0), torch.bfloat16)],
)
def test_auto_takes_the_per_run_loop_where_torch_grouped_mm_would_sync_and_warns_why(
    monkeypatch, caplog, fresh_lora_decisions, capability, dtype
):
    # What torch's CUDA _grouped_mm does on this GPU and dtype, decided without one: only
    # bf16 on compute capability 9.x / 10.x has a kernel; elsewhere it syncs to loop.
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    layer = MultiLoRALinear(nn.Linear(16, 24), rank=8, n_adapters=2, alpha=8.0)
    with caplog.at_level(logging.WARNING, logger="workbench.trainer.lora.layer"):
        assert layer.select_compute(torch.device("cuda"), dtype) == "per_run_loop"
        MultiLoRALinear(nn.Linear(16, 24), rank=8, n_adapters=2, alpha=8.0).select_compute(
            torch.device("cuda"), dtype
        )
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "one warning per reason, not one per layer"
    major, minor = capability
    assert f"sm_{major}{minor}" in warnings[0].getMessage()
    assert "offsets to the host" in warnings[0].getMessage()
    assert f"sm_{major}{minor}" in layer.compute_reason


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] not in (9, 10),
    reason="needs a Hopper or Blackwell GPU",
)
def test_auto_takes_torch_grouped_mm_for_bf16_on_hopper_and_blackwell():
    layer = MultiLoRALinear(nn.Linear(16, 24).cuda().bfloat16(), rank=8, n_adapters=2, alpha=8.0)
    assert layer.select_compute(torch.device("cuda"), torch.bfloat16) == "grouped"
    assert layer.select_compute(torch.device("cuda"), torch.float32) == "per_run_loop"


@pytest.mark.parametrize("path", ["grouped", "per_run_loop"])
def test_a_compiled_lora_layer_is_not_recompiled_for_each_rows_token_counts(path):
    # The counts reach the op as an offsets tensor, never as Python ints the graph would be
    # specialised on: one compilation for the first shape, one dynamic one after that.
    if path == "grouped" and grouped_mm_problem("cpu", torch.float32):
        pytest.skip(grouped_mm_problem("cpu", torch.float32))
    layer = random_layer(path)
    counter = CompileCounter()
    compiled = torch.compile(layer, backend=counter)
    for counts in ([3, 0, 5], [7, 2, 1], [1, 1, 9], [0, 12, 4], [5, 5, 5], [2, 9, 0]):
        layer.routing.set_num_tokens(counts)
        x = torch.randn(sum(counts), 16, requires_grad=True)
        compiled(x).square().sum().backward()
    assert counter.frame_count <= 2


@pytest.mark.parametrize("grouped_mm", [True, False], ids=["grouped", "per_run_loop"])
def test_the_compiled_multi_lora_op_passes_torchs_custom_op_checks(grouped_mm):
    # Its schema, fake (shape) function and autograd registration, as torch.compile uses them.
    if grouped_mm and grouped_mm_problem("cpu", torch.float32):
        pytest.skip(grouped_mm_problem("cpu", torch.float32))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(9, 16, generator=generator, requires_grad=True)
    lora_a = torch.randn(3, 8, 16, generator=generator, requires_grad=True)
    scaled_lora_b = torch.randn(3, 24, 8, generator=generator, requires_grad=True)
    offsets = torch.tensor([4, 4, 9], dtype=torch.int32)
    torch.library.opcheck(
        lora_ops.multi_lora_forward, (x, lora_a, scaled_lora_b, offsets, grouped_mm)
    )


# ---------------------------------------------------------------------------- model wiring


def test_apply_lora_wraps_every_projection_and_registers_it_under_its_module_path(
    tmp_path: Path,
):
    trainer = build_trainer(tmp_path / "exp", {"run_a": ""})
    projections = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    projections += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    expected = [f"model.layers.{layer}.{proj}" for layer in range(2) for proj in projections]
    assert sorted(trainer.lora_layers) == sorted(expected)
    registered = {key.rpartition(".lora_")[0] for key in trainer.manager.get_state_dict_for_run(0)}
    assert registered == set(expected)
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


def test_a_runs_state_dict_loads_back_at_the_runs_rank(tmp_path: Path):
    trainer = build_trainer(tmp_path / "exp", {"run_a": "[lora]\nrank = 4\n"})
    state = trainer.manager.get_state_dict_for_run(0)
    changed = {key: tensor + 1.0 for key, tensor in state.items()}
    load_state_dict_for_run(trainer.model, 0, changed)
    for key, tensor in trainer.manager.get_state_dict_for_run(0).items():
        torch.testing.assert_close(tensor, changed[key], rtol=0, atol=0)
    assert state["model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 32)


# ---------------------------------------------------------------------------- a bf16 base


def one_update(trainer, samples: list[torch.Tensor], counts: list[int]) -> None:
    logits = packed_logits(trainer.model, samples, counts)
    logits.float().square().mean().backward()
    trainer.manager.ready_to_update[:] = [True] * len(counts)
    trainer.optimizer.step()
    trainer.scheduler.step()
    trainer.optimizer.zero_grad()


def test_a_bf16_base_keeps_float32_adapters_that_learn_from_updates_of_1e_5(tmp_path: Path):
    trainer = build_trainer(tmp_path / "exp", {"run_a": "lr = 1e-5\n"}, dtype=torch.bfloat16)
    params = dict(trainer.manager.get_named_parameters_for_run(0))
    assert all(p.dtype == torch.float32 for p in params.values())
    initial = {name: p.detach().clone() for name, p in params.items()}
    samples = [torch.arange(3, 12), torch.arange(20, 31)]
    for _ in range(2):  # B moves first (it starts at zero), then A has a gradient too
        one_update(trainer, samples, [20])

    state = trainer.optimizer.optimizers[0].state
    assert {state[p][key].dtype for p in params.values() for key in ("exp_avg", "exp_avg_sq")} == {
        torch.float32
    }
    for name, param in params.items():
        # A is about 0.1: in bf16 (8 bits of mantissa) a step of 1e-5 would round away.
        changed = (param != initial[name]).float().mean().item()
        assert changed > 0.5, f"{name}: only {changed:.0%} of its entries moved"


def test_a_bf16_bases_checkpoint_and_broadcast_keep_the_float32_adapter(tmp_path: Path):
    trainer = build_trainer(tmp_path / "exp", {"run_a": "lr = 1e-5\n"}, dtype=torch.bfloat16)
    one_update(trainer, [torch.arange(3, 12), torch.arange(20, 31)], [20])
    trainer.manager.progress[0].step = 1
    checkpoint = RunCheckpointer(trainer.manager, trainer.optimizer, trainer.scheduler).save(0)
    broadcast = write_adapter(
        tmp_path / "broadcast",
        trainer.manager.get_state_dict_for_run(0),
        rank=8,
        alpha=16.0,
        target_modules=list(DEFAULT_TARGET_MODULES),
        base_model=str(tmp_path),
    )

    # vLLM and peft read float32 adapters and cast them to the model's dtype themselves.
    published = load_file(str(broadcast / "adapter_model.safetensors"))
    for key, tensor in trainer.manager.get_state_dict_for_run(0).items():
        assert published[PEFT_PREFIX + key].dtype == torch.float32
        torch.testing.assert_close(published[PEFT_PREFIX + key], tensor, rtol=0, atol=0)
    assert {t.dtype for t in load_file(str(checkpoint / "adapter.safetensors")).values()} == {
        torch.float32
    }

    resumed = build_trainer(tmp_path / "exp", {}, max_runs=1, dtype=torch.bfloat16)
    resumed_checkpointer = RunCheckpointer(resumed.manager, resumed.optimizer, resumed.scheduler)
    assert resumed_checkpointer.restore(0) == 1
    ours = dict(resumed.manager.get_named_parameters_for_run(0))
    theirs = dict(trainer.manager.get_named_parameters_for_run(0))
    for name, param in theirs.items():
        torch.testing.assert_close(ours[name], param, rtol=0, atol=0)
        moments = resumed.optimizer.optimizers[0].state[ours[name]]
        assert moments["exp_avg"].dtype == torch.float32
        torch.testing.assert_close(
            moments["exp_avg"], trainer.optimizer.optimizers[0].state[param]["exp_avg"]
        )
