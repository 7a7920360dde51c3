"""Tinker work items answered by the real trainer loop (`rl.trainer.iterate`): the losses
against their formulas written out here, gradients that add up across forward_backward
items until optim_step, results and weights bit for bit the same alone and co-batched,
and the save / load / sampler-weights items."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import make_run, random_batch
from tests.trainer.rl.test_rl_trainer import make_trainer
from workbench.files import layout
from workbench.files import tinker_work as tw
from workbench.files.rollouts import write_rollouts
from workbench.trainer.lora.layer import set_lora_num_tokens
from workbench.trainer.rl.trainer import iterate

pytestmark = pytest.mark.slow
VOCAB = 64


def tinker_run(experiment: Path, name: str) -> Path:
    return make_run(experiment, name, 'source = "tinker"\nseed = 0\n')


def make_datums(seed: int, n: int) -> list[dict[str, np.ndarray]]:
    """Next-token datums of 5 to 11 tokens with weights (some 0), advantages and sampler
    log-probs about those of a uniform distribution over the vocabulary."""
    rng = np.random.default_rng(seed)
    datums = []
    for _ in range(n):
        length = int(rng.integers(5, 12))
        tokens = rng.integers(0, VOCAB, length + 1)
        weights = rng.uniform(0.0, 1.0, length).astype(np.float32)
        weights[0] = 0.0
        datums.append(
            {
                "input_ids": tokens[:-1].astype(np.int64),
                "target_tokens": tokens[1:].astype(np.int64),
                "weights": weights,
                "advantages": rng.normal(size=length).astype(np.float32),
                "logprobs": (np.log(1 / VOCAB) + rng.normal(0, 0.3, length)).astype(np.float32),
            }
        )
    return datums


def as_tensors(datums: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {tw.datum_key(i, k): v for i, datum in enumerate(datums) for k, v in datum.items()}


def submit(run: Path, seq: int, op: str, datums=(), **fields) -> int:
    if op in tw.DATUM_OPS:
        fields.setdefault("loss_fn", "cross_entropy")
    request = tw.WorkRequest(seq=seq, op=op, num_datums=len(datums), **fields)
    tw.write_request(run, request, as_tensors(list(datums)))
    return seq


def drain(trainer, run: Path, seq: int, passes: int = 20) -> tw.WorkResult:
    """Passes of the trainer's loop until item `seq` of `run` is answered."""
    for _ in range(passes):
        result = tw.read_result(run, seq)
        if result is not None:
            return result
        iterate(trainer)
    raise AssertionError(f"work item {seq} of {run.name} not answered in {passes} passes")


def adapter(trainer, run: Path) -> dict[str, torch.Tensor]:
    return trainer.manager.get_state_dict_for_run(trainer.manager.id_2_idx[run.name])


def slot_grads(trainer, run: Path) -> dict[str, torch.Tensor]:
    idx = trainer.manager.id_2_idx[run.name]
    return {
        name: param.grad.clone()
        for name, param in trainer.manager.get_named_parameters_for_run(idx)
        if param.grad is not None
    }


def plain_logprobs(trainer, run: Path, datum: dict[str, np.ndarray]) -> torch.Tensor:
    """log p(target_tokens[t] | input_ids[:t+1]) through the model's own forward and logits."""
    input_ids = torch.from_numpy(datum["input_ids"])[None]
    counts = torch.zeros(trainer.manager.max_runs, dtype=torch.int64)
    counts[trainer.manager.id_2_idx[run.name]] = input_ids.numel()
    set_lora_num_tokens(trainer.model, counts)
    logits = trainer.model(input_ids=input_ids).logits[0].float()
    targets = torch.from_numpy(datum["target_tokens"])
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)


def formula(loss_fn: str, lp: torch.Tensor, datum: dict, config: dict) -> torch.Tensor:
    """Tinker's losses as its docs write them, per token, times the weights."""
    w = torch.from_numpy(datum["weights"])
    if loss_fn == "cross_entropy":
        return -w * lp
    a = torch.from_numpy(datum["advantages"])
    if loss_fn == "dro":  # tinker-docs /tinker/losses/dro
        quadratic_term = (lp - torch.from_numpy(datum["logprobs"])) ** 2
        return -w * (lp * a - 0.5 * config["beta"] * quadratic_term)
    r = torch.exp(lp - torch.from_numpy(datum["logprobs"]))
    lo, hi = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
    if loss_fn == "importance_sampling":
        return -w * r * a
    if loss_fn == "ppo":
        return -w * torch.minimum(r * a, torch.clamp(r, lo, hi) * a)
    assert loss_fn == "cispo"
    return -w * torch.clamp(r, lo, hi).detach() * lp * a


ADAM = tw.AdamParams(lr=0.05, weight_decay=0.01)


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"])
def test_each_loss_is_its_formula_in_value_and_gradient(experiment, tiny_llama, loss_fn):
    run = tinker_run(experiment, "run_tinker_a")
    trainer = make_trainer(experiment, tiny_llama)
    # A first step, so that the adapter's B is not zero and A gets gradients too.
    submit(run, 0, "forward_backward", make_datums(1, 4))
    assert drain(trainer, run, submit(run, 1, "optim_step", adam=ADAM)).ok
    datums = make_datums(2, 3)
    config = {
        "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
        "dro": {"beta": 0.05},
    }.get(loss_fn, {})
    for datum in datums:  # sampler log-probs near the trainer's: some ratios clip, some not
        with torch.no_grad():
            lp = plain_logprobs(trainer, run, datum).numpy()
        datum["logprobs"] = (lp + np.random.default_rng(3).normal(0, 0.2, lp.size)).astype(
            np.float32
        )
    submit(run, 2, "forward_backward", datums, loss_fn=loss_fn, loss_fn_config=config or None)
    result = drain(trainer, run, 2)
    assert result.ok, result.error
    ours = slot_grads(trainer, run)

    idx = trainer.manager.id_2_idx[run.name]
    for _, param in trainer.manager.get_named_parameters_for_run(idx):
        param.grad = None
    total = torch.zeros(())
    clipped = 0
    for datum, out in zip(datums, result.datums(3), strict=True):
        lp = plain_logprobs(trainer, run, datum)
        ratio = torch.exp(lp.detach() - torch.from_numpy(datum["logprobs"]))
        clipped += int(((ratio < 0.8) | (ratio > 1.2)).sum())
        terms = formula(loss_fn, lp, datum, config)
        torch.testing.assert_close(
            torch.from_numpy(out["logprobs"]), lp.detach(), atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(
            torch.from_numpy(out["elementwise_loss"]), terms.detach(), atol=1e-5, rtol=1e-4
        )
        total = total + terms.sum()
    total.backward()
    assert result.metrics["loss:sum"] == pytest.approx(total.item(), rel=1e-5, abs=1e-6)
    assert clipped > 0, "no ratio outside the clip range: the clipped branch is untested"
    reference = slot_grads(trainer, run)
    assert set(ours) == set(reference) and any(g.abs().sum() > 0 for g in reference.values())
    for name, grad in reference.items():
        torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "a_row_each"])
def test_gradients_add_up_until_optim_step_two_items_of_4_as_one_of_8(
    experiment, tiny_llama, packed
):
    """Bit for bit: each datum's gradient is its own, added to the slot in datum order."""
    split, whole = tinker_run(experiment, "run_tinker_a"), tinker_run(experiment, "run_tinker_b")
    trainer = make_trainer(experiment, tiny_llama)
    if not packed:
        trainer.tinker_packing = False
    for round_ in range(2):
        datums = make_datums(10 + round_, 8)
        base = 3 * round_
        submit(split, base, "forward_backward", datums[:4], loss_fn="importance_sampling")
        submit(whole, 2 * round_, "forward_backward", datums, loss_fn="importance_sampling")
        submit(whole, 2 * round_ + 1, "optim_step", adam=ADAM)
        assert drain(trainer, split, base).ok  # the second half in a later pass
        submit(split, base + 1, "forward_backward", datums[4:], loss_fn="importance_sampling")
        submit(split, base + 2, "optim_step", adam=ADAM)
        assert drain(trainer, split, base + 2).ok and drain(trainer, whole, 2 * round_ + 1).ok
        halves = tw.read_result(split, base).datums(4) + tw.read_result(split, base + 1).datums(4)
        for ours, theirs in zip(halves, tw.read_result(whole, 2 * round_).datums(8), strict=True):
            for name in ("logprobs", "elementwise_loss"):
                assert np.array_equal(ours[name], theirs[name]), name
    before = make_trainer(experiment / "fresh", tiny_llama)  # an untrained adapter
    tinker_run(experiment / "fresh", "run_tinker_a")
    iterate(before)
    untrained = adapter(before, experiment / "fresh" / "run_tinker_a")
    a, b = adapter(trainer, split), adapter(trainer, whole)
    assert any(not torch.equal(a[k], untrained[k]) for k in a), "nothing trained"
    for key, tensor in a.items():
        assert torch.equal(tensor, b[key]), key
    assert trainer.manager.progress[trainer.manager.id_2_idx[split.name]].step == 2
    assert trainer.tinker_packing is packed


def script(run: Path) -> list[tuple[str, dict]]:
    """One Tinker run's items: forward_backward, forward, optim_step, again."""
    items = []
    for round_ in range(2):
        datums = make_datums(20 + round_, 3)
        items += [
            ("forward_backward", {"datums": datums, "loss_fn": "ppo"}),
            ("forward", {"datums": make_datums(30 + round_, 2), "loss_fn": "cross_entropy"}),
            ("optim_step", {"adam": ADAM}),
        ]
    return items


def play(trainer, run: Path, native: Path | None = None, other: Path | None = None) -> list:
    """Submit `script(run)` item by item, with a native batch and another Tinker run's
    items pending in the same passes; the answers."""
    results = []
    for seq, (op, fields) in enumerate(script(run)):
        submit(run, seq, op, **fields)
        if native is not None:
            step = trainer.manager.progress[trainer.manager.id_2_idx[native.name]].step
            write_rollouts(native, random_batch(native.name, step, 6, seed=seq))
        if other is not None:
            submit(other, seq, "forward_backward", make_datums(40 + seq, 5), loss_fn="cispo")
        results.append(drain(trainer, run, seq))
    return results


@pytest.mark.parametrize("row_threads", ["auto", 1])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "a_row_each"])
def test_a_tinker_run_is_bit_identical_alone_and_beside_native_and_tinker_runs(
    tmp_path, tiny_llama, row_threads, packed
):
    """Packed (datums sharing rows, `tinker_packing.py`: what this CPU's check chooses) and
    with a row per datum (where the check refuses packing)."""
    alone_exp, together_exp = tmp_path / "alone", tmp_path / "together"
    alone_run = tinker_run(alone_exp, "run_tinker_x")
    native = make_run(together_exp, "run_a", "lr = 0.01\n")
    other = tinker_run(together_exp, "run_tinker_b")
    together_run = tinker_run(together_exp, "run_tinker_x")
    alone = make_trainer(alone_exp, tiny_llama, row_threads=row_threads)
    together = make_trainer(together_exp, tiny_llama, row_threads=row_threads)
    if not packed:
        alone.tinker_packing = together.tinker_packing = False
    iterate(together)
    assert together.manager.id_2_idx["run_tinker_x"] != 0, "not in the slot it has alone"
    ours = play(alone, alone_run)
    theirs = play(together, together_run, native=native, other=other)
    assert together.manager.progress[together.manager.id_2_idx["run_a"]].step >= 3
    for mine, co in zip(ours, theirs, strict=True):
        assert mine.ok and co.ok
        assert mine.metrics == co.metrics
        assert mine.tensors.keys() == co.tensors.keys()
        for key, value in mine.tensors.items():
            assert np.array_equal(value, co.tensors[key]), key
    a, b = adapter(alone, alone_run), adapter(together, together_run)
    for key, tensor in a.items():
        assert torch.equal(tensor, b[key]), key
    assert alone.tinker_packing is together.tinker_packing is packed


def test_save_load_and_sampler_weights(experiment, tiny_llama):
    run = tinker_run(experiment, "run_tinker_a")
    trainer = make_trainer(experiment, tiny_llama)
    states = tw.tinker_dir(run) / "weights"
    submit(run, 0, "forward_backward", make_datums(1, 4))
    submit(run, 1, "optim_step", adam=ADAM)
    submit(run, 2, "save_state", path=str(states / "one"), with_optimizer=True)
    submit(run, 3, "save_weights_for_sampler", path=str(tw.tinker_dir(run) / "sampler" / "one"))
    sampler = drain(trainer, run, 3)
    assert sampler.ok and sampler.data["step"] == 1 and sampler.data["adapter"] == f"{run.name}@1"
    assert layout.is_stable(layout.broadcast_dir(run, 1))
    assert (tw.tinker_dir(run) / "sampler" / "one" / "adapter_config.json").is_file()
    saved = adapter(trainer, run)
    idx = trainer.manager.id_2_idx[run.name]
    saved_moments = {
        k: v.clone() for k, v in trainer.optimizer.optimizers[idx].state_dict()["state"][0].items()
    }

    submit(run, 4, "forward_backward", make_datums(2, 4))
    submit(run, 5, "optim_step", adam=ADAM)
    submit(run, 6, "load_state", path=str(states / "one"), with_optimizer=True)
    assert drain(trainer, run, 6).ok
    for key, tensor in adapter(trainer, run).items():
        assert torch.equal(tensor, saved[key]), key
    for key, value in trainer.optimizer.optimizers[idx].state_dict()["state"][0].items():
        assert torch.equal(value, saved_moments[key]), key
    assert trainer.manager.progress[idx].step == 3, "a load is a new version"

    submit(run, 7, "load_state", path=str(states / "one"), with_optimizer=False)
    assert drain(trainer, run, 7).ok
    assert trainer.optimizer.optimizers[idx].state_dict()["state"] == {}
    refused = drain(trainer, run, submit(run, 8, "save_state", path=str(states / "one")))
    assert not refused.ok and "never written over" in refused.error


def test_bad_datums_fail_their_item_only(experiment, tiny_llama):
    run = tinker_run(experiment, "run_tinker_a")
    trainer = make_trainer(experiment, tiny_llama)
    bad = make_datums(1, 2)
    bad[1]["target_tokens"] = bad[1]["target_tokens"].copy()
    bad[1]["target_tokens"][-1] = VOCAB + 3
    submit(run, 0, "forward_backward", bad)
    shifted = make_datums(2, 1)
    shifted[0]["target_tokens"] = shifted[0]["input_ids"].copy()
    submit(run, 1, "forward_backward", shifted)
    submit(run, 2, "forward_backward", make_datums(3, 1), loss_fn="ppo")
    no_adv = make_datums(4, 1)
    del no_adv[0]["advantages"]
    submit(run, 3, "forward_backward", no_adv, loss_fn="importance_sampling")
    submit(run, 4, "forward_backward", make_datums(5, 2), loss_fn="dro")  # no beta
    good = drain(trainer, run, submit(run, 5, "forward_backward", make_datums(6, 2)))
    errors = [tw.read_result(run, seq).error for seq in range(5)]
    assert "datum 1: target_tokens holds a token id outside the vocabulary" in errors[0]
    assert "shifted by one" in errors[1]
    assert tw.read_result(run, 2).ok
    assert "needs loss_fn_inputs advantages" in errors[3]
    assert "'dro' needs loss_fn_config={'beta': ...}" in errors[4]
    assert good.ok and trainer.manager.id_2_idx.get(run.name) is not None


def test_an_op_of_a_run_without_datums_in_the_pass_is_answered_before_the_pass_computes(
    experiment, tiny_llama, monkeypatch
):
    """A client's save for its sampler does not wait for other clients' datums; an
    optim_step after its own run's datums still waits for their backward."""
    from workbench.trainer.rl import trainer as trainer_module

    saver, busy = tinker_run(experiment, "run_tinker_a"), tinker_run(experiment, "run_tinker_b")
    trainer = make_trainer(experiment, tiny_llama)
    iterate(trainer)
    seen_at_compute = []
    real_train_step = trainer_module.train_step

    def watched_train_step(*args, **kwargs):
        seen_at_compute.append(
            (tw.read_result(saver, 0) is not None, tw.read_result(busy, 1) is not None)
        )
        return real_train_step(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "train_step", watched_train_step)
    sampler_dir = tw.tinker_dir(saver) / "sampler" / "one"
    submit(saver, 0, "save_weights_for_sampler", path=str(sampler_dir))
    submit(busy, 0, "forward_backward", make_datums(1, 6))
    submit(busy, 1, "optim_step", adam=ADAM)
    iterate(trainer)
    assert seen_at_compute == [(True, False)]
    assert tw.read_result(saver, 0).ok and tw.read_result(busy, 1).ok
