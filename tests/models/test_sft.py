"""`workbench sft`: the loss covers completion tokens only and falls; full fine-tuning saves a
Hugging Face model, LoRA a peft adapter; bad input is refused before any training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from typer.testing import CliRunner

from workbench.envs import get_environment
from workbench.trainer.sft.train import (
    IGNORE_INDEX,
    SFTConfig,
    SFTExample,
    SFTLoraConfig,
    collate,
    encode_example,
    evaluate_greedy,
    load_model,
    read_jsonl_examples,
    train_sft,
)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_only_completion_tokens_carry_labels(untrained_model_dir: Path):
    tokenizer, _ = load_model(untrained_model_dir)
    example = SFTExample([{"role": "user", "content": "abc"}], "cba")
    encoded = encode_example(tokenizer, example, max_length=64)
    assert tokenizer.decode(encoded.input_ids) == "<bos><|user|>abc<eos><|assistant|>cba<eos>"
    batch = collate([encoded, encode_example(tokenizer, example, 64)], tokenizer.pad_token_id)
    labels = batch["labels"][0]
    learnt = [int(t) for t in labels if t != IGNORE_INDEX]
    assert tokenizer.decode(learnt) == "cba<eos>"  # the answer and the end of the turn
    assert (labels[: encoded.prompt_length] == IGNORE_INDEX).all()


def test_padding_is_masked_and_never_learnt(untrained_model_dir: Path):
    tokenizer, _ = load_model(untrained_model_dir)
    short = encode_example(tokenizer, SFTExample([{"role": "user", "content": "a"}], "a"), 64)
    long = encode_example(tokenizer, SFTExample([{"role": "user", "content": "abcd"}], "dcba"), 64)
    batch = collate([short, long], tokenizer.pad_token_id)
    pad = batch["attention_mask"][0] == 0
    assert pad.sum() == len(long.input_ids) - len(short.input_ids)
    assert (batch["labels"][0][pad] == IGNORE_INDEX).all()
    assert (batch["input_ids"][0][pad] == tokenizer.pad_token_id).all()


def test_an_example_longer_than_max_length_is_an_error(untrained_model_dir: Path):
    tokenizer, _ = load_model(untrained_model_dir)
    with pytest.raises(ValueError, match="max_length=8"):
        encode_example(tokenizer, SFTExample([{"role": "user", "content": "a" * 20}], "b"), 8)


def test_full_fine_tuning_lowers_the_loss_and_saves_a_loadable_model(
    untrained_model_dir: Path, tmp_path: Path
):
    output = tmp_path / "sft"
    result = train_sft(
        SFTConfig(
            model=str(untrained_model_dir),
            output_dir=output,
            env="reverse_text",
            env_args={"min_length": 3, "max_length": 5},
            steps=40,
            batch_size=16,
            lr=1e-2,
            eval_prompts=8,
            threads=1,
        ),
        show_progress=False,
    )
    assert len(result.losses) == 40
    assert _mean(result.losses[-5:]) < 0.85 * _mean(result.losses[:5])
    assert {"config.json", "model.safetensors", "tokenizer.json", "sft_summary.json"} <= {
        p.name for p in output.iterdir()
    }
    # The saved model is the trained one: it reproduces the reward measured in training.
    tokenizer, model = load_model(output)
    env = get_environment("reverse_text", min_length=3, max_length=5)
    reward = evaluate_greedy(model.eval(), tokenizer, env, n=8).mean_reward
    assert reward == pytest.approx(result.final_reward)
    summary = json.loads((output / "sft_summary.json").read_text())
    assert summary["result"]["final_loss"] == result.losses[-1]


def test_lora_mode_saves_a_peft_adapter_that_reproduces_the_trained_model(
    untrained_model_dir: Path, tmp_path: Path
):
    output = tmp_path / "adapter"
    result = train_sft(
        SFTConfig(
            model=str(untrained_model_dir),
            output_dir=output,
            env="reverse_text",
            env_args={"min_length": 3, "max_length": 5},
            steps=15,
            batch_size=8,
            lr=1e-2,
            lora=SFTLoraConfig(rank=4, alpha=8),
            eval_prompts=8,
            threads=1,
        ),
        show_progress=False,
    )
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in output.iterdir()
    }
    assert not (output / "model.safetensors").exists()
    assert result.trainable_params < result.total_params / 4

    tokenizer, base = load_model(untrained_model_dir)
    input_ids = torch.tensor([tokenizer.encode("<bos><|user|>abc<eos><|assistant|>")])
    base_logits = base(input_ids=input_ids).logits
    adapted = PeftModel.from_pretrained(base, output).eval()
    assert adapted.peft_config["default"].r == 4
    assert not torch.allclose(adapted(input_ids=input_ids).logits, base_logits)
    env = get_environment("reverse_text", min_length=3, max_length=5)
    reward = evaluate_greedy(adapted, tokenizer, env, n=8).mean_reward
    assert reward == pytest.approx(result.final_reward)


def test_jsonl_data_in_both_formats_trains(untrained_model_dir: Path, tmp_path: Path):
    data = tmp_path / "pairs.jsonl"
    data.write_text(
        json.dumps({"prompt": "abc", "completion": "cba"})
        + "\n\n"
        + json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "reverse."},
                    {"role": "user", "content": "xy"},
                    {"role": "assistant", "content": "yx"},
                ]
            }
        )
        + "\n"
    )
    examples = read_jsonl_examples(data)
    assert examples[0] == SFTExample([{"role": "user", "content": "abc"}], "cba")
    assert examples[1].messages[0]["role"] == "system" and examples[1].completion == "yx"
    result = train_sft(
        SFTConfig(
            model=str(untrained_model_dir),
            output_dir=tmp_path / "out",
            data=data,
            steps=20,
            batch_size=4,
            lr=1e-2,
            threads=1,
        ),
        show_progress=False,
    )
    assert _mean(result.losses[-3:]) < _mean(result.losses[:3])


def test_a_bad_jsonl_line_is_named(tmp_path: Path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "a", "completion": "a"}\n{"prompt": "no completion"}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl_examples(data)


def test_exactly_one_data_source_is_required(tmp_path: Path):
    with pytest.raises(ValueError, match="exactly one data source"):
        SFTConfig(model="m", output_dir=tmp_path)
    with pytest.raises(ValueError, match="exactly one data source"):
        SFTConfig(model="m", output_dir=tmp_path, env="reverse_text", data=tmp_path / "x")


def test_a_non_model_output_directory_is_not_replaced(untrained_model_dir: Path, tmp_path: Path):
    precious = tmp_path / "work"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="holds no model"):
        train_sft(
            SFTConfig(
                model=str(untrained_model_dir), output_dir=precious, env="reverse_text", steps=1
            ),
            show_progress=False,
        )
    assert (precious / "notes.txt").read_text() == "keep me"


def test_the_sft_command_trains_and_reports_json(untrained_model_dir: Path, tmp_path: Path):
    from workbench.cli import app

    output = tmp_path / "cli-out"
    result = CliRunner().invoke(
        app,
        [
            "sft",
            "--model",
            str(untrained_model_dir),
            "--output-dir",
            str(output),
            "--env",
            "reverse_text",
            "--env-arg",
            "max_length=5",
            "--env-arg",
            "min_length=3",
            "--steps",
            "3",
            "--batch-size",
            "4",
            "--threads",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["steps"] == 3 and report["output_dir"] == str(output)
    assert (output / "model.safetensors").is_file()


def test_the_sft_command_rejects_a_bad_env_arg_with_exit_code_2(
    untrained_model_dir: Path, tmp_path: Path
):
    from workbench.cli import app

    result = CliRunner().invoke(
        app,
        [
            "sft",
            "--model",
            str(untrained_model_dir),
            "-o",
            str(tmp_path / "x"),
            "--env",
            "reverse_text",
            "--env-arg",
            "max_len=5",
        ],
    )
    assert result.exit_code == 2
    assert "max_len" in result.output
    assert not (tmp_path / "x").exists()
