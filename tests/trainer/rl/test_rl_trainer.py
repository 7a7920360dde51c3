"""The RL trainer in one process: batches in, adapters out, isolation of bad runs."""

from __future__ import annotations

import copy
import logging
import threading
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from tests.helpers import (
    assert_same_gradients,
    gradients_at_each_update,
    iterate_published,
    make_run,
    random_batch,
    random_multi_turn_batch,
)
from workbench.config import ModelSection, TrainerConfig, TrainerSection
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics
from workbench.files.rollouts import RolloutBatch, write_rollouts
from workbench.trainer.lora.layer import set_lora_num_tokens
from workbench.trainer.rl.trainer import build_trainer, load_base_model


def make_trainer(experiment: Path, model_dir: Path, **section):
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base=str(model_dir)),
        trainer=TrainerSection(max_concurrent_runs=3, seq_len=64, **section),
    )
    model = load_base_model(str(model_dir), torch.float32, torch.device("cpu"))
    return build_trainer(config, model, torch.device("cpu"))


def test_a_step_broadcasts_each_runs_adapter_and_logs_its_metrics(experiment, tiny_llama):
    runs = [make_run(experiment, name, "lr = 0.01\n") for name in ("run_a", "run_b")]
    trainer = make_trainer(experiment, tiny_llama)
    assert iterate_published(trainer) == "idle"
    for run in runs:
        write_rollouts(run, random_batch(run.name, 0, 6, seed=1))
    assert iterate_published(trainer) == "trained"
    for run in runs:
        adapter = layout.broadcast_dir(run, 1)
        assert layout.is_stable(adapter)
        assert (adapter / "adapter_config.json").is_file()
        line = read_metrics(run, "trainer")[-1]
        assert line["step"] == 1 and line["loss"] == line["loss"] and line["grad_norm"] > 0
    idx = trainer.manager.id_2_idx["run_a"]
    assert trainer.manager.progress[idx].step == 1
    assert iterate_published(trainer) == "idle", "no step_1 batch yet"


def test_broadcast_adapter_loaded_with_peft_reproduces_the_trainers_outputs(experiment, tiny_llama):
    run = make_run(experiment, "run_a", "lr = 0.05\n")
    trainer = make_trainer(experiment, tiny_llama)
    iterate_published(trainer)
    write_rollouts(run, random_batch("run_a", 0, 8, seed=2))
    assert iterate_published(trainer) == "trained"

    input_ids = torch.tensor([[3, 17, 9, 42, 5, 33, 8]])
    idx = trainer.manager.id_2_idx["run_a"]
    counts = torch.zeros(trainer.manager.max_runs, dtype=torch.long)
    counts[idx] = input_ids.numel()
    set_lora_num_tokens(trainer.model, counts)
    with torch.no_grad():
        ours = trainer.model(input_ids=input_ids).logits
        base = AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32)
        plain = base(input_ids=input_ids).logits
        peft_model = PeftModel.from_pretrained(base, str(layout.broadcast_dir(run, 1)))
        theirs = peft_model(input_ids=input_ids).logits
    assert not torch.allclose(ours, plain, atol=1e-4), "the adapter must have changed something"
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


def test_bad_rollout_file_evicts_only_its_run_with_a_readable_reason(experiment, tiny_llama):
    good = make_run(experiment, "run_good")
    bad = make_run(experiment, "run_bad")
    trainer = make_trainer(experiment, tiny_llama)
    iterate_published(trainer)
    write_rollouts(good, random_batch("run_good", 0, 4, seed=3))
    broken = random_batch("run_bad", 0, 4, seed=3)
    broken.samples[2].completion_ids = [999]  # outside the vocabulary of 64
    broken.samples[2].completion_logprobs = [-1.0]
    write_rollouts(bad, broken)
    assert iterate_published(trainer) == "trained"
    assert layout.is_stable(layout.broadcast_dir(good, 1))
    reason = run_control.read_eviction(bad).reason
    assert "sample 2" in reason and "token id 999" in reason
    iterate_published(trainer)
    assert list(trainer.manager.id_2_idx) == ["run_good"]


@pytest.mark.parametrize(
    ("break_sample_2", "expected"),
    [
        ("nothing trained", "sample 2 has no trained token"),
        ("a trained prompt token", "sample 2 has loss_mask 1 on a prompt token"),
    ],
)
def test_an_invalid_loss_mask_evicts_only_its_run_naming_the_sample(
    experiment, tiny_llama, break_sample_2, expected
):
    good = make_run(experiment, "run_good")
    bad = make_run(experiment, "run_bad")
    trainer = make_trainer(experiment, tiny_llama)
    iterate_published(trainer)
    write_rollouts(good, random_multi_turn_batch("run_good", 0, 4, seed=3))
    broken = random_multi_turn_batch("run_bad", 0, 4, seed=3)
    if break_sample_2 == "nothing trained":
        broken.samples[2].completion_mask = [False] * len(broken.samples[2].completion_ids)
    step_dir = write_rollouts(bad, broken)
    if break_sample_2 == "a trained prompt token":
        tensors = load_file(str(step_dir / "batch.safetensors"))
        tensors["loss_mask"][sum(s.num_tokens for s in broken.samples[:2])] = 1
        save_file(tensors, str(step_dir / "batch.safetensors"))
    assert iterate_published(trainer) == "trained"
    assert layout.is_stable(layout.broadcast_dir(good, 1))
    assert expected in run_control.read_eviction(bad).reason
    assert run_control.read_eviction(good) is None
    iterate_published(trainer)
    assert list(trainer.manager.id_2_idx) == ["run_good"]


def without_closing_message(batch: RolloutBatch) -> RolloutBatch:
    """The same episodes ending at the model's last token (the environment's last message
    cut off): the same trained tokens, each with the same context."""
    batch = copy.deepcopy(batch)
    for sample in batch.samples:
        last = max(t for t, trained in enumerate(sample.completion_mask) if trained) + 1
        sample.completion_ids = sample.completion_ids[:last]
        sample.completion_logprobs = sample.completion_logprobs[:last]
        sample.completion_mask = sample.completion_mask[:last]
    return batch


def with_other_environment_tokens(batch: RolloutBatch, step_dir: Path) -> None:
    """Write `batch` with other token ids in each closing message, and garbage where the
    file holds the environment tokens' log-probs (written over what the writer put there)."""
    batch = copy.deepcopy(batch)
    for sample in batch.samples:
        last = max(t for t, trained in enumerate(sample.completion_mask) if trained) + 1
        closing = range(last, len(sample.completion_ids))
        for t in closing:
            sample.completion_ids[t] = 3 + (sample.completion_ids[t] + 17) % 61
    write_rollouts(step_dir, batch)
    path = layout.rollout_dir(step_dir, batch.step) / "batch.safetensors"
    tensors = load_file(str(path))
    environment = (tensors["loss_mask"] == 0).nonzero().flatten()
    garbage = torch.tensor([5.0, -40.0, float("nan"), float("inf")])
    tensors["inference_logprobs"][environment] = garbage.repeat(len(environment))[
        : len(environment)
    ]
    save_file(tensors, str(path))


def test_the_update_ignores_the_environments_tokens_and_does_not_count_them(tmp_path, tiny_llama):
    episodes = random_multi_turn_batch("run_a", 0, 6, seed=7)
    outcomes = {}
    for name in ("as written", "other environment tokens", "closing message absent"):
        experiment = tmp_path / name
        run = make_run(experiment, "run_a", "lr = 0.01\n")
        if name == "as written":
            write_rollouts(run, episodes)
        elif name == "other environment tokens":
            with_other_environment_tokens(episodes, run)
        else:
            write_rollouts(run, without_closing_message(episodes))
        trainer = make_trainer(experiment, tiny_llama)
        gradients = gradients_at_each_update(trainer)
        assert iterate_published(trainer) == "trained"
        line = read_metrics(run, "trainer")[-1]
        state = trainer.manager.get_state_dict_for_run(trainer.manager.id_2_idx["run_a"])
        outcomes[name] = (line["loss"], line["grad_norm"], state, gradients)

    loss, grad_norm, state, gradients = outcomes["as written"]
    # What the environment's tokens are and what log-probs a writer left on them change
    # nothing: the same length, bit for bit.
    other_loss, other_grad_norm, other_state, _ = outcomes["other environment tokens"]
    assert (other_loss, other_grad_norm) == (loss, grad_norm)
    assert all(torch.equal(other_state[key], tensor) for key, tensor in state.items())
    # They are not counted either: the loss is the mean over the model's tokens, the same
    # as without the closing messages (counting them would lower loss and gradient).
    # Rows of another length sum in another order: the gradients agree to rounding.
    absent_loss, absent_grad_norm, _, absent_gradients = outcomes["closing message absent"]
    assert (absent_loss, absent_grad_norm) == pytest.approx((loss, grad_norm), rel=1e-5)
    assert_same_gradients(absent_gradients, gradients)


def test_packed_samples_do_not_attend_across_sample_boundaries(tiny_llama):
    from workbench.trainer.compute.attention import packed_attention_mask

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_llama), dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    first, second = torch.tensor([3, 5, 7, 9]), torch.tensor([11, 13, 15])
    packed = torch.cat([first, second])
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    with torch.no_grad():
        together = model(
            input_ids=packed[None],
            position_ids=positions[None],
            attention_mask=packed_attention_mask(positions),
        ).logits[0]
        alone = [model(input_ids=ids[None]).logits[0] for ids in (first, second)]
    torch.testing.assert_close(together, torch.cat(alone), rtol=1e-5, atol=1e-5)


def test_an_update_raises_positive_and_lowers_negative_advantage_completions(
    experiment, tiny_llama
):
    from workbench.files.rollouts import RolloutBatch, Sample

    run = make_run(experiment, "run_a", "lr = 0.01\n")
    trainer = make_trainer(experiment, tiny_llama)
    iterate_published(trainer)
    good = Sample([3, 4, 5], [10, 11, 12], [0.0] * 3, advantage=1.0, reward=1.0)
    bad = Sample([3, 4, 5], [20, 21, 22], [0.0] * 3, advantage=-1.0, reward=0.0)

    def sequence_logprob(sample: Sample) -> float:
        ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
        idx = trainer.manager.id_2_idx["run_a"]
        counts = torch.zeros(trainer.manager.max_runs, dtype=torch.long)
        counts[idx] = ids.numel()
        set_lora_num_tokens(trainer.model, counts)
        with torch.no_grad():
            logprobs = torch.log_softmax(trainer.model(input_ids=ids).logits[0], -1)
        return sum(float(logprobs[2 + i, t]) for i, t in enumerate(sample.completion_ids))

    before = [sequence_logprob(s) for s in (good, bad)]
    # The sampler's log-probs are the current policy's, so every ratio starts at 1.
    for sample, value in zip((good, bad), before, strict=True):
        sample.completion_logprobs = [value / 3] * 3
    write_rollouts(run, RolloutBatch("run_a", 0, 0, [good, bad]))
    assert iterate_published(trainer) == "trained"
    after = [sequence_logprob(s) for s in (good, bad)]
    assert after[0] > before[0] and after[1] < before[1]


def test_per_sample_attention_chunked_head_and_recompute_train_what_the_dense_reference_does(
    tmp_path, tiny_llama
):
    # Runs at different temperatures, several samples per row, so every part of the packed
    # computation is exercised; the reference is the quadratic mask with full logits.
    settings = {
        "reference": {"attention": "dense", "logprob_chunk_tokens": 0},
        "default": {},
        "recompute": {"activation_checkpointing": True, "logprob_chunk_tokens": 5},
    }
    gradients = {}
    for name, section in settings.items():
        experiment = tmp_path / name
        experiment.mkdir()
        for run_id, temperature in (("run_a", 1.0), ("run_b", 0.6)):
            orch = f"lr = 0.01\nsampling = {{ temperature = {temperature} }}\n"
            run = make_run(experiment, run_id, orch)
            write_rollouts(run, random_batch(run_id, 0, 6, seed=4))
        trainer = make_trainer(experiment, tiny_llama, **section)
        gradients[name] = gradients_at_each_update(trainer)
        assert iterate_published(trainer) == "trained"
        losses = {
            run_id: read_metrics(experiment / run_id, "trainer")[-1]["loss"]
            for run_id in ("run_a", "run_b")
        }
        if name == "reference":
            reference_losses = losses
        else:
            assert losses == pytest.approx(reference_losses, rel=1e-5)
    # Gradients, not the adapters after the update (see assert_same_gradients).
    assert all(g.abs().max() > 0 for k, g in gradients["reference"].items() if "lora_B" in k)
    for name in ("default", "recompute"):
        assert_same_gradients(gradients[name], gradients["reference"])


def test_the_trainer_logs_one_line_per_run_and_update_with_its_figures(
    experiment, tiny_llama, caplog
):
    runs = [make_run(experiment, name, "lr = 0.01\n") for name in ("run_a", "run_b")]
    trainer = make_trainer(experiment, tiny_llama)
    iterate_published(trainer)
    for run in runs:
        write_rollouts(run, random_batch(run.name, 0, 6, seed=1))
    # Only this update's lines: the trainer's setup logs at INFO too, and is captured when an
    # earlier test left the logger at INFO.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="workbench.trainer"):
        assert iterate_published(trainer) == "trained"
    lines = [r.getMessage() for r in caplog.records if r.name == "workbench.trainer"]
    assert len(lines) == 2, lines
    for run, line in zip(sorted(runs), sorted(lines), strict=True):
        record = read_metrics(run, "trainer")[-1]
        assert line.startswith(f"{run.name} step 1 loss {record['loss']:.4f} ")
        assert f"lr {record['lr']:.2e} tokens {record['tokens']} step_s " in line


def test_an_update_returns_before_its_adapters_are_written_and_they_land_after(
    experiment, tiny_llama, monkeypatch
):
    from workbench.trainer.rl.trainer import iterate, wait_for_publications
    from workbench.trainer.runs import publisher

    release, real = threading.Event(), publisher.write_adapter

    def slow_disk(*args, **kwargs):
        assert release.wait(timeout=60)
        return real(*args, **kwargs)

    monkeypatch.setattr(publisher, "write_adapter", slow_disk)
    runs = [make_run(experiment, name, "lr = 0.01\n") for name in ("run_a", "run_b")]
    trainer = make_trainer(experiment, tiny_llama)
    iterate(trainer)
    for run in runs:
        write_rollouts(run, random_batch(run.name, 0, 6, seed=1))
    assert iterate(trainer) == "trained"  # with both writes still held
    idx = trainer.manager.id_2_idx["run_a"]
    step_1 = trainer.manager.get_state_dict_for_run(idx)
    for run in runs:
        assert read_metrics(run, "trainer")[-1]["step"] == 1
        assert not layout.is_stable(layout.broadcast_dir(run, 1))
    with torch.no_grad():  # the next update changes the slots while step 1 is written
        for param in trainer.model.parameters():
            if param.requires_grad:
                param.add_(1.0)
    release.set()
    wait_for_publications(trainer)
    assert all(layout.is_stable(layout.broadcast_dir(run, 1)) for run in runs)
    written = load_file(str(layout.broadcast_dir(runs[0], 1) / "adapter_model.safetensors"))
    assert written.keys() == {f"base_model.model.{key}" for key in step_1}
    for key, tensor in step_1.items():
        assert torch.equal(written[f"base_model.model.{key}"], tensor), key


def test_a_stop_checkpoints_what_was_trained_and_leaves_a_waiting_batch_for_the_resume(
    experiment, tiny_llama
):
    # The signal comes while the run's next batch waits: it is not collected, so the
    # checkpoint says step 1 (what the adapter holds) and the resume trains step_1's batch.
    run = make_run(experiment, "run_a", "lr = 0.01\ncheckpoint_interval = 100\n")
    trainer = make_trainer(experiment, tiny_llama)
    write_rollouts(run, random_batch(run.name, 0, 6, seed=1))
    assert iterate_published(trainer) == "trained"
    write_rollouts(run, random_batch(run.name, 1, 6, seed=2))
    trainer.stop_requested = True
    assert iterate_published(trainer) == "stopped"
    assert layout.checkpoint_steps(run, "trainer") == [1]
    assert [m["step"] for m in read_metrics(run, "trainer")] == [1]

    resumed = make_trainer(experiment, tiny_llama)
    assert iterate_published(resumed) == "trained"
    assert [m["step"] for m in read_metrics(run, "trainer")] == [1, 2]
