"""A broadcast adapter loads with peft alone, on the base model its config names, and gives
the trainer's own outputs."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.export.harness import BASE, STEPS, TrainedRun, logits_without_workbench
from workbench.files import layout
from workbench.models import resolve_model
from workbench.trainer.runs.broadcast import read_adapter_info


def test_a_broadcast_names_the_built_model_and_keeps_the_builtin_name_beside_it(
    trained: TrainedRun,
):
    adapter = layout.broadcast_dir(trained.run, STEPS)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(resolve_model(BASE))
    assert read_adapter_info(adapter)["base_model"] == BASE


def test_peft_without_workbench_loads_a_broadcast_and_gives_the_trainers_logits(
    trained: TrainedRun, tmp_path: Path
):
    adapter = layout.broadcast_dir(trained.run, STEPS)
    setup = f"""
        import json
        from peft import PeftModel
        from transformers import AutoModelForCausalLM
        cfg = json.load(open({str(adapter / "adapter_config.json")!r}))
        base = AutoModelForCausalLM.from_pretrained(cfg["base_model_name_or_path"])
        model = PeftModel.from_pretrained(base, {str(adapter)!r})
    """
    theirs = logits_without_workbench(tmp_path, setup)
    assert not torch.allclose(trained.logits[STEPS], trained.logits[0], atol=1e-4), (
        "the adapter must change the base model's outputs"
    )
    torch.testing.assert_close(theirs, trained.logits[STEPS], rtol=1e-5, atol=1e-5)
