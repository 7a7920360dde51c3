"""Slots sized from memory (workbench.supervisor.slots): `max_concurrent_runs = "auto"`, the
arithmetic `up --dry-run` prints, and an explicit number that cannot fit refused before
launch.

The adapter sizes come from real model configs made on the meta device (the built-in model
and a Qwen3-0.6B-shaped config, no weights); the GPU pools are fed memory sizes, since no
GPU is here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

from tests.supervisor.test_preflight import REPO, model_dir, write
from workbench.bench.trainer import model_config
from workbench.models.resolve import model_shapes
from workbench.recipe import recipe_from_document
from workbench.supervisor import slots
from workbench.up import RecipeError, read_recipe

GIB = 1 << 30

RECIPE = """\
[experiment]
name = "slots"
output_dir = "{output_dir}"

[model]
base = "{base}"

[trainer]
max_concurrent_runs = {slots}
{trainer}

[inference]
{inference}

[defaults]
env = "reverse_text"
env_args = {{ min_length = 9, max_length = 9 }}
max_steps = 5
{runs}
"""


def recipe_text(
    tmp_path: Path,
    *,
    slots: str = '"auto"',
    runs: int = 3,
    base: str = "builtin:tiny-reverse",
    trainer: str = "",
    inference: str = "",
) -> str:
    tables = "".join(f'\n[[runs]]\nid = "r{i}"\n' for i in range(runs))
    return RECIPE.format(
        output_dir=tmp_path / "out",
        base=base,
        slots=slots,
        runs=tables,
        trainer=trainer,
        inference=inference,
    )


def qwen3_shaped(tmp_path: Path) -> str:
    """A directory with Qwen3-0.6B's config (the shape `bench trainer` names qwen3-0.6b)."""
    return str(model_dir(tmp_path, model_config("qwen3-0.6b")))


def test_auto_gives_every_run_a_slot_when_memory_holds_them(tmp_path: Path):
    document, recipe = read_recipe(write(tmp_path, recipe_text(tmp_path, runs=3)))
    assert recipe.trainer.max_concurrent_runs == 3
    assert recipe.max_loras == 6  # max_loras follows: two adapters a slot
    # The experiment's recipe.toml carries the number, saying where it came from.
    written = tomlkit.dumps(document)
    assert "max_concurrent_runs = 3" in written and '"auto" at launch' in written
    arithmetic = "\n".join(recipe.slot_arithmetic)
    assert 'max_concurrent_runs = 3 ("auto"), max_loras = 6' in arithmetic
    assert "per trainer slot" in arithmetic and "orchestrator 64.0 MiB" in arithmetic


def test_auto_takes_no_more_slots_than_memory_holds(tmp_path: Path, monkeypatch):
    # A host whose planned-for share holds the fixed part and half a slot more: none fits.
    _, roomy = read_recipe(write(tmp_path, recipe_text(tmp_path, runs=1)))
    (pool,) = slots.size_slots(roomy).pools
    fixed, slot = pool.needs(0, 0), pool.needs(1, 2) - pool.needs(0, 0)
    tight = int((fixed + slot / 2) / slots.HOST_SHARE)
    monkeypatch.setattr(slots, "memory_total_bytes", lambda: tight)
    with pytest.raises(RecipeError) as caught:
        read_recipe(write(tmp_path, recipe_text(tmp_path, runs=3)))
    assert 'max_concurrent_runs = "auto" (not even 1 slot) does not fit the host' in str(
        caught.value
    )
    # 6 GiB: 4.5 planned for, 1 GiB left over the fixed 3.5: some 15 slots of 66 MiB.
    monkeypatch.setattr(slots, "memory_total_bytes", lambda: 6 * GIB)
    _, recipe = read_recipe(write(tmp_path, recipe_text(tmp_path, runs=40)))
    pool = slots.size_slots(recipe).pools[0]
    fit = recipe.trainer.max_concurrent_runs
    assert 1 < fit < 40
    assert pool.needs(fit, 2 * fit) <= pool.usable < pool.needs(fit + 1, 2 * fit + 2)


def test_an_explicit_number_that_cannot_fit_is_refused_naming_the_key_and_figures(
    tmp_path: Path,
):
    with pytest.raises(RecipeError) as caught:
        read_recipe(write(tmp_path, recipe_text(tmp_path, slots="100000")))
    message = str(caught.value)
    assert "max_concurrent_runs" in message.splitlines()[1]  # the key's line
    assert "[trainer] max_concurrent_runs = 100000 does not fit the host" in message
    assert "100000 trainer slots x 65.2 MiB" in message and "slots fit: lower it" in message
    # Adapters alone too many: max_loras is the key to lower.
    with pytest.raises(RecipeError) as caught:
        read_recipe(
            write(tmp_path, recipe_text(tmp_path, slots="3", inference="max_loras = 50000000"))
        )
    message = str(caught.value)
    assert "[inference] max_loras = 50000000 does not fit the host" in message
    assert "lower max_loras to at most 6" in message


def test_a_qwen3_shaped_adapter_costs_what_its_layers_say(tmp_path: Path):
    base = qwen3_shaped(tmp_path)
    shapes = model_shapes(base)
    layers, hidden, mlp = 28, 1024, 3072
    q, kv = 16 * 128, 8 * 128
    per_layer = (hidden + q) + 2 * (hidden + kv) + (q + hidden) + 3 * (hidden + mlp)
    assert shapes.adapter_parameters(16, ["q_proj", "k_proj", "v_proj", "o_proj",
                                          "gate_proj", "up_proj", "down_proj"]) == (
        16 * layers * per_layer
    )  # fmt: skip
    # About 0.6 B parameters (0.44 B besides the tied embeddings).
    assert 0.55e9 < shapes.parameters < 0.65e9


def test_on_one_shared_gpu_trainer_and_vllm_share_its_memory(tmp_path: Path):
    base = qwen3_shaped(tmp_path)
    text = recipe_text(
        tmp_path,
        slots="64",
        base=base,
        trainer='dtype = "bfloat16"\nlora = { rank = 16, alpha = 32 }',
    )
    recipe = recipe_from_document(tomlkit.parse(text), None, text)
    shapes = model_shapes(base)
    trainer_gpu, vllm_gpu, host = slots.machine_pools(recipe, shapes, 128 * GIB, [80 * GIB])
    adapter = shapes.adapter_parameters(16, recipe.trainer.target_modules)
    assert trainer_gpu.total == int(80 * GIB * (1 - 0.45))  # what vLLM's fraction leaves
    assert dict(trainer_gpu.per_slot) == {"adapter, gradients and AdamW state": 16 * adapter}
    assert dict(trainer_gpu.fixed) == {"trainer weights": 2 * shapes.parameters}
    assert vllm_gpu.total == int(80 * GIB * 0.45)
    # vLLM's buffers: every decoder linear at max_lora_rank 16, bfloat16.
    assert dict(vllm_gpu.per_adapter) == {"vLLM's LoRA buffers": 2 * adapter}
    assert dict(host.per_slot) == {"orchestrator": slots.ORCHESTRATOR_BYTES}
    sizing = slots.SlotSizing(min(p.slots_that_fit(None) for p in (trainer_gpu, vllm_gpu, host)),
                              [trainer_gpu, vllm_gpu, host])  # fmt: skip
    recipe.trainer.max_concurrent_runs = sizing.fit
    assert sizing.problem(recipe, text) is None
    recipe.trainer.max_concurrent_runs = sizing.fit + 1
    problem = sizing.problem(recipe, text)
    assert problem is not None and problem.key == "trainer.max_concurrent_runs"
    assert "does not fit" in problem.message


def test_dry_run_prints_the_arithmetic(tmp_path: Path):
    recipe = write(tmp_path, recipe_text(tmp_path, runs=2))
    result = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "up", str(recipe), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert 'slots: max_concurrent_runs = 2 ("auto"), max_loras = 4; memory holds' in out
    assert "the host:" in out and "per vLLM adapter" in out
    assert "with 2 slots and 4 adapters:" in out
    assert not (tmp_path / "out").exists()


def test_a_model_too_large_for_the_machine_is_noted_not_blamed_on_the_slots(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setattr(slots, "memory_total_bytes", lambda: 2 * GIB)  # under the fixed part
    _, recipe = read_recipe(write(tmp_path, recipe_text(tmp_path, slots="2")))
    assert recipe.trainer.max_concurrent_runs == 2
    assert any("the model may not fit here" in line for line in recipe.slot_arithmetic)


def test_a_recipe_still_saying_auto_is_not_mistaken_for_a_number():
    text = recipe_text(Path("/tmp"), runs=1)
    recipe = recipe_from_document(tomlkit.parse(text), None, text)
    with pytest.raises(ValueError, match="sized before launch"):
        _ = recipe.max_loras
