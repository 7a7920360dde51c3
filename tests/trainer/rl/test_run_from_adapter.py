"""A run started from a peft LoRA adapter (`lora.init_from`): its slot computes what the
adapter computes, published as version 0; an adapter that does not fit rejects the run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.helpers import iterate_published, make_run, random_batch
from workbench.config import ModelSection, TrainerConfig, TrainerSection
from workbench.files import layout, run_control
from workbench.files.rollouts import write_rollouts
from workbench.trainer.rl.trainer import build_trainer, load_base_model

PREFIX = "base_model.model."


def peft_adapter(model_dir: Path, directory: Path, rank: int, modules: list[str]) -> Path:
    """An adapter as peft's `save_pretrained` writes one (what `workbench sft --lora`
    saves), with B drawn at random so it changes the model."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank + 3, target_modules=modules)
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    peft_model.save_pretrained(str(directory))
    return directory


def make_trainer(experiment: Path, model_dir: Path):
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base=str(model_dir)),
        trainer=TrainerSection(max_concurrent_runs=2, seq_len=64),  # rank 8, alpha 16
    )
    model = load_base_model(str(model_dir), torch.float32, torch.device("cpu"))
    return build_trainer(config, model, torch.device("cpu"))


def deltas(weights: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """Each adapted module's weight change, B @ A * scale, by module path."""
    return {
        key.removeprefix(PREFIX).removesuffix(".lora_A.weight"): (
            weights[key.replace("lora_A", "lora_B")] @ weights[key] * scale
        )
        for key in weights
        if key.endswith(".lora_A.weight")
    }


def test_a_run_from_an_adapter_computes_what_the_adapter_computes_from_version_0(
    tmp_path, tiny_llama
):
    # Rank 4 of the run's 8, alpha 11, two of the trainer's seven modules.
    adapter = peft_adapter(tiny_llama, tmp_path / "sft", 4, ["q_proj", "v_proj"])
    experiment = tmp_path / "exp"
    run = make_run(experiment, "run_a", f'lora = {{ init_from = "{adapter}" }}\n')
    trainer = make_trainer(experiment, tiny_llama)
    assert iterate_published(trainer) == "idle"  # admitted: its slot is set, nothing to train yet

    version_0 = layout.broadcast_dir(run, 0)
    assert layout.is_stable(version_0)
    published = deltas(load_file(str(version_0 / "adapter_model.safetensors")), 16 / 8)
    wanted = deltas(load_file(str(adapter / "adapter_model.safetensors")), 11 / 4)
    assert set(wanted) < set(published)  # every module of the trainer is published
    for module, delta in published.items():
        expected = wanted.get(module, torch.zeros_like(delta))
        torch.testing.assert_close(delta, expected, rtol=1e-5, atol=1e-6, msg=module)
    assert any(delta.abs().max() > 0 for delta in wanted.values())


def test_an_adapter_that_does_not_fit_rejects_the_run_naming_the_key(tmp_path, tiny_llama):
    too_big = peft_adapter(tiny_llama, tmp_path / "r16", 16, ["q_proj"])
    experiment = tmp_path / "exp"
    big = make_run(experiment, "run_big", f'lora = {{ init_from = "{too_big}" }}\n')
    not_one = make_run(experiment, "run_none", f'lora = {{ init_from = "{tmp_path}" }}\n')
    trainer = make_trainer(experiment, tiny_llama)
    iterate_published(trainer)  # admitted; setting up their slots fails
    iterate_published(trainer)  # and at the next discovery they leave, rejected with the reason

    assert trainer.manager.used_idxs == []
    big_reason = run_control.run_condition(big).reason
    assert "lora.init_from" in big_reason and "has rank 16, more than this run's 8" in big_reason
    none_reason = run_control.run_condition(not_one).reason
    assert "is not a peft adapter directory (no adapter_config.json" in none_reason


def test_an_adapter_of_another_base_model_is_refused(tmp_path, tiny_llama):
    adapter = peft_adapter(tiny_llama, tmp_path / "sft", 4, ["q_proj"])
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "Qwen/Qwen3-0.6B"
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    experiment = tmp_path / "exp"
    run = make_run(experiment, "run_a", f'lora = {{ init_from = "{adapter}" }}\n')
    trainer = make_trainer(experiment, tiny_llama)
    iterate_published(trainer)
    iterate_published(trainer)
    reason = run_control.run_condition(run).reason
    assert "is an adapter of Qwen/Qwen3-0.6B, not of this experiment's base model" in reason


def test_a_run_with_checkpoints_of_its_own_resumes_without_its_adapter_directory(
    tmp_path, tiny_llama
):
    adapter = peft_adapter(tiny_llama, tmp_path / "sft", 4, ["q_proj"])
    experiment = tmp_path / "exp"
    run = make_run(experiment, "run_a", f'lora = {{ init_from = "{adapter}" }}\n')
    write_rollouts(run, random_batch("run_a", 0, 6, seed=1))
    first = make_trainer(experiment, tiny_llama)
    assert [iterate_published(first) for _ in range(2)] == ["trained", "idle"]
    first.checkpointer.save(first.manager.id_2_idx["run_a"])
    shutil.rmtree(adapter)  # cleaned up once RL was under way

    second = make_trainer(experiment, tiny_llama)
    assert iterate_published(second) == "idle"
    assert second.manager.progress[second.manager.id_2_idx["run_a"]].step == 1
    assert run_control.run_condition(run).reason is None
