"""Rollout batches on disk, and how the packer turns them into micro-batches."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers import make_run, random_batch, random_multi_turn_batch
from workbench.files import layout, run_control
from workbench.files.rollouts import (
    InvalidRollouts,
    RolloutBatch,
    Sample,
    read_rollouts,
    write_rollouts,
)
from workbench.trainer.compute.attention import PackedSequences
from workbench.trainer.rl.packer import Packer, distribute, pack_batches
from workbench.trainer.runs.manager import MultiRunManager


def sample(
    prompt: int,
    completion: int,
    advantage: float = 0.5,
    first_token: int = 3,
    mask: list[bool] | None = None,
) -> Sample:
    return Sample(
        prompt_ids=list(range(first_token, first_token + prompt)),
        completion_ids=list(range(first_token + prompt, first_token + prompt + completion)),
        completion_logprobs=[-0.1 * (i + 1) for i in range(completion)],
        advantage=advantage,
        reward=advantage + 0.5,
        completion_mask=mask,
    )


def rewrite_as_version_1(step_dir: Path) -> None:
    """Turn a written batch into what the writer before multi-turn episodes wrote: no
    loss_mask tensor, version 1 in batch.json."""
    tensors = load_file(str(step_dir / "batch.safetensors"))
    del tensors["loss_mask"]
    save_file(tensors, str(step_dir / "batch.safetensors"))
    meta = json.loads((step_dir / "batch.json").read_text())
    (step_dir / "batch.json").write_text(json.dumps({**meta, "version": 1}))


def test_rollout_batch_round_trips_through_disk(tmp_path: Path):
    batch = RolloutBatch(
        "run_a", step=4, policy_version=3, samples=[sample(3, 2), sample(2, 4, -0.5)]
    )
    path = write_rollouts(tmp_path / "run_a", batch)
    assert path == layout.rollout_dir(tmp_path / "run_a", 4) and layout.is_stable(path)
    read = read_rollouts(path, vocab_size=64, max_sample_tokens=16)
    assert (read.run_id, read.step, read.policy_version) == ("run_a", 4, 3)
    for got, sent in zip(read.samples(), batch.samples, strict=True):
        assert (got.prompt_ids, got.completion_ids) == (sent.prompt_ids, sent.completion_ids)
        assert (got.advantage, got.reward) == pytest.approx((sent.advantage, sent.reward))
    assert read.samples()[1].completion_logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4])


def test_a_multi_turn_mask_round_trips_and_environment_tokens_carry_no_log_prob(tmp_path: Path):
    mask = [True, True, False, False, True]
    batch = RolloutBatch("run_a", 0, 0, [sample(3, 2), sample(2, 5, mask=mask)])
    batch.samples[1].completion_logprobs[2:4] = [-7.0, float("nan")]  # whatever the env gave
    path = write_rollouts(tmp_path, batch)
    on_disk = load_file(str(path / "batch.safetensors"))
    assert on_disk["loss_mask"].dtype == torch.uint8
    assert on_disk["loss_mask"].tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1]
    assert on_disk["inference_logprobs"][9:11].tolist() == [0.0, 0.0]
    read = read_rollouts(path, vocab_size=64)
    single, multi = read.samples()
    assert single.completion_mask is None, "a single-turn sample reads back as it was written"
    assert multi.completion_mask == mask
    assert multi.completion_logprobs == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.5])
    assert read.loss_mask.dtype == torch.bool


def test_a_version_1_batch_written_before_the_upgrade_reads_with_every_completion_token_trained(
    experiment: Path,
):
    run = make_run(experiment, "run_a")
    step_dir = write_rollouts(run, RolloutBatch("run_a", 0, 0, [sample(3, 2), sample(2, 4)]))
    current = read_rollouts(step_dir)
    rewrite_as_version_1(step_dir)
    old = read_rollouts(step_dir, vocab_size=64, max_sample_tokens=16)
    assert old.loss_mask.tolist() == [False] * 3 + [True] * 2 + [False] * 2 + [True] * 4
    assert [s.completion_mask for s in old.samples()] == [None, None]
    # it trains exactly as the same samples written today do
    manager = MultiRunManager(experiment, max_runs=2)
    manager.discover_runs()
    manager.synchronize_state()
    packer = Packer(manager, seq_len=16, vocab_size=64)
    collected = packer.collect()
    assert list(collected) == [manager.id_2_idx["run_a"]], "the old batch is taken"
    (row_old,) = packer.pack(collected)[0]
    (row_now,) = packer.pack({manager.id_2_idx["run_a"]: current})[0]
    for name in ("input_ids", "position_ids", "loss_mask", "inference_logprobs", "advantages"):
        assert torch.equal(getattr(row_old, name), getattr(row_now, name)), name
    assert torch.equal(row_old.run_loss_tokens, row_now.run_loss_tokens)


def test_a_batch_of_a_newer_format_version_is_refused_saying_what_to_do(tmp_path: Path):
    path = write_rollouts(tmp_path, RolloutBatch("run_a", 0, 0, [sample(3, 2)]))
    meta = json.loads((path / "batch.json").read_text())
    (path / "batch.json").write_text(json.dumps({**meta, "version": 3}))
    with pytest.raises(InvalidRollouts, match=r"version 3 but this trainer reads versions 1 to 2"):
        read_rollouts(path)


def test_a_completion_mask_that_is_not_one_value_per_completion_token_is_not_written(
    tmp_path: Path,
):
    batch = RolloutBatch("run_a", 0, 0, [sample(3, 2), sample(2, 4, mask=[True, False, True])])
    with pytest.raises(InvalidRollouts, match="sample 1 has a completion_mask of 3 values for 4"):
        write_rollouts(tmp_path, batch)
    assert not layout.rollout_dir(tmp_path, 0).exists()


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda t: t.update(prompt_lengths=torch.tensor([0, 2])), "sample 0 has 0 prompt tokens"),
        (
            lambda t: t.update(prompt_lengths=torch.tensor([3, 6])),
            "sample 1 has 6 prompt tokens of 6",
        ),
        (lambda t: t.update(advantages=torch.tensor([0.0])), "advantages has shape (1,)"),
        (lambda t: t.update(input_ids=t["input_ids"][:-1]), "add up to 11 tokens"),
        (lambda t: t["input_ids"].__setitem__(7, 999), "sample 1 has token id 999"),
        (lambda t: t["inference_logprobs"].__setitem__(4, float("nan")), "sample 0 has log-probs"),
        (lambda t: t.update(loss_mask=t["loss_mask"][:-1]), "loss_mask has 10 values but"),
        (lambda t: t["loss_mask"].__setitem__(6, 2), "sample 1 has loss_mask value 2"),
        (lambda t: t["loss_mask"].__setitem__(5, 1), "sample 1 has loss_mask 1 on a prompt token"),
        (lambda t: t["loss_mask"][7:].zero_(), "sample 1 has no trained token"),
        (lambda t: t["inference_logprobs"].__setitem__(9, 0.5), "sample 1 has log-probs"),
        (lambda t: t.pop("loss_mask"), "lacks loss_mask"),
    ],
)
def test_damaged_batches_are_rejected_naming_the_sample(tmp_path: Path, damage, expected):
    batch = [sample(3, 2), sample(2, 4, mask=[True, False, True, True])]
    path = write_rollouts(tmp_path, RolloutBatch("run_a", 0, 0, batch))
    tensors = load_file(str(path / "batch.safetensors"))
    damage(tensors)
    save_file(tensors, str(path / "batch.safetensors"))
    with pytest.raises(InvalidRollouts, match=expected.replace("(", r"\(").replace(")", r"\)")):
        read_rollouts(path, vocab_size=64)


def test_what_a_writer_left_on_environment_tokens_is_read_as_log_prob_0(tmp_path: Path):
    batch = [sample(3, 2), sample(2, 4, mask=[True, False, True, True])]
    path = write_rollouts(tmp_path, RolloutBatch("run_a", 0, 0, batch))
    tensors = load_file(str(path / "batch.safetensors"))
    tensors["inference_logprobs"][8] = float("nan")  # the environment's token of sample 1
    save_file(tensors, str(path / "batch.safetensors"))
    read = read_rollouts(path, vocab_size=64)
    assert read.inference_logprobs[8].item() == 0.0


def test_sample_longer_than_seq_len_is_rejected_with_what_to_change(tmp_path: Path):
    path = write_rollouts(tmp_path, RolloutBatch("run_a", 0, 0, [sample(3, 2), sample(10, 10)]))
    with pytest.raises(InvalidRollouts, match=r"sample 1 has 20 tokens, longer than .* seq_len 16"):
        read_rollouts(path, max_sample_tokens=16)


def test_empty_batch_is_rejected(tmp_path: Path):
    path = write_rollouts(tmp_path, RolloutBatch("run_a", 0, 0, []))
    with pytest.raises(InvalidRollouts, match="empty"):
        read_rollouts(path)


def test_packed_rows_keep_each_runs_tokens_contiguous_and_count_them(tmp_path: Path):
    batches = {}
    for idx, sizes in {0: [(3, 2), (2, 2)], 2: [(4, 3)], 1: [(2, 1)]}.items():
        path = write_rollouts(
            tmp_path / f"r{idx}", RolloutBatch(f"r{idx}", 0, 0, [sample(*s) for s in sizes])
        )
        batches[idx] = read_rollouts(path)
    rows = pack_batches(batches, seq_len=10, max_runs=4)
    # slot order 0, 0, 1, 2 with lengths 5, 4, 3, 7: rows [5+4], [3+7]
    assert [row.lora_num_tokens.tolist() for row in rows] == [[9, 0, 0, 0], [0, 3, 7, 0]]
    assert all(row.num_tokens <= 10 for row in rows)
    assert rows[0].run_loss_tokens.tolist() == [4, 1, 3, 0]
    first = rows[0]
    assert first.position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    # sample 1 of run 0: prompt [3, 4], completion [5, 6]; fields align with input_ids
    assert first.input_ids[5:9].tolist() == [3, 4, 5, 6]
    assert first.loss_mask[5:9].tolist() == [False, False, True, True]
    assert first.inference_logprobs[5:9].tolist() == pytest.approx([0.0, 0.0, -0.1, -0.2])
    assert int(first.loss_mask.sum()) == 4


def test_only_the_models_own_tokens_carry_loss_and_count_for_the_runs_normalisation(
    tmp_path: Path,
):
    episode = sample(2, 5, mask=[True, True, False, False, True])
    batches = {
        0: read_rollouts(write_rollouts(tmp_path / "r0", RolloutBatch("r0", 0, 0, [episode]))),
        1: read_rollouts(write_rollouts(tmp_path / "r1", RolloutBatch("r1", 0, 0, [sample(3, 3)]))),
    }
    (row,) = pack_batches(batches, seq_len=16, max_runs=2)
    assert row.loss_mask[:7].tolist() == [False, False, True, True, False, False, True]
    assert row.loss_mask[7:].tolist() == [False] * 3 + [True] * 3
    assert row.inference_logprobs[:7].tolist() == pytest.approx([0, 0, -0.1, -0.2, 0, 0, -0.5])
    # 3 of run 0's 5 completion tokens are the model's: its loss is divided by 3, not 5
    assert row.run_loss_tokens.tolist() == [3, 3]


def test_the_packer_keeps_an_episode_whole(tmp_path: Path):
    episodes = random_multi_turn_batch("run_a", 0, 12, seed=5)
    batches = {
        idx: read_rollouts(write_rollouts(tmp_path / f"r{idx}", batch))
        for idx, batch in ((0, episodes), (1, random_batch("run_b", 0, 7, seed=5)))
    }
    seq_len = 24
    rows = pack_batches(batches, seq_len=seq_len, max_runs=2)
    sent = [(0, s) for s in batches[0].samples()] + [(1, s) for s in batches[1].samples()]
    assert len(rows) > 2, "the samples need several rows, so some would straddle a boundary"
    packed = []
    for row in rows:
        assert row.num_tokens <= seq_len
        starts = [*(row.position_ids == 0).nonzero().flatten().tolist(), row.num_tokens]
        for begin, end in itertools.pairwise(starts):
            packed.append((row.input_ids[begin:end].tolist(), row.loss_mask[begin:end].tolist()))
    # every sample is in exactly one row, whole, in order, with its own mask
    assert packed == [
        (s.prompt_ids + s.completion_ids, [False] * len(s.prompt_ids) + s.trained())
        for _, s in sent
    ]
    total = torch.zeros(2, dtype=torch.int64)
    for idx, s in sent:
        total[idx] += sum(s.trained())
    assert all(torch.equal(row.run_loss_tokens, total) for row in rows)


def test_rows_are_shared_out_so_ranks_get_similar_token_counts():
    class Row:
        def __init__(self, n):
            self.num_tokens = n

    shares = distribute([Row(n) for n in (10, 9, 8, 7)], world_size=2)
    assert sorted(sum(r.num_tokens for r in share) for share in shares) == [17, 17]


def test_packer_takes_each_runs_next_batch_updates_progress_and_evicts_bad_runs(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=3)
    good, bad, idle = (make_run(experiment, name) for name in ("run_good", "run_bad", "run_idle"))
    manager.discover_runs()
    manager.synchronize_state()
    write_rollouts(good, RolloutBatch("run_good", 0, 0, [sample(3, 2), sample(3, 3)]))
    bad_step = write_rollouts(bad, RolloutBatch("run_bad", 0, 0, [sample(3, 2)]))
    (bad_step / "batch.json").write_text("{broken")
    # a step the trainer is not at yet is not taken
    write_rollouts(idle, RolloutBatch("run_idle", 1, 0, [sample(3, 2)]))

    packer = Packer(manager, seq_len=32, vocab_size=64)
    batches = packer.collect()
    good_idx = manager.id_2_idx["run_good"]
    assert list(batches) == [good_idx]
    assert manager.ready_to_update_idxs == [good_idx]
    progress = manager.progress[good_idx]
    assert (progress.step, progress.total_samples, progress.total_tokens) == (1, 2, 11)
    eviction = run_control.read_eviction(bad)
    assert eviction is not None and "batch.json is not valid JSON" in eviction.reason
    assert run_control.read_eviction(idle) is None and run_control.read_eviction(good) is None
    assert packer.collect() == {}, "a ready run is not collected twice before it trains"


def completions(prompt: list[int], tokens: list[list[int]], masks=None) -> list[Sample]:
    masks = masks or [None] * len(tokens)
    return [
        Sample(
            prompt_ids=prompt,
            completion_ids=ids,
            completion_logprobs=[-0.1] * len(ids),
            advantage=0.25 * i,
            reward=0.0,
            completion_mask=mask,
        )
        for i, (ids, mask) in enumerate(zip(tokens, masks, strict=True))
    ]


def trained_tokens(rows) -> list[tuple[int, int, float, float]]:
    """(run, token, sampler log-prob, advantage) of every trained token, in row order."""
    out = []
    for row in rows:
        runs = torch.repeat_interleave(torch.arange(len(row.lora_num_tokens)), row.lora_num_tokens)
        for t in row.loss_mask.nonzero().flatten().tolist():
            out.append(
                (
                    int(runs[t]),
                    int(row.input_ids[t]),
                    float(row.inference_logprobs[t]),
                    float(row.advantages[t]),
                )
            )
    return out


def test_completions_of_one_prompt_share_it_in_a_row_and_train_the_same_tokens(tmp_path: Path):
    prompt = list(range(3, 16))  # 13 tokens
    generator = torch.Generator().manual_seed(0)
    group = [torch.randint(20, 60, (10,), generator=generator).tolist() for _ in range(8)]
    batches = {
        0: read_rollouts(
            write_rollouts(tmp_path / "r0", RolloutBatch("r0", 0, 0, completions(prompt, group)))
        ),
        # The same prompt in another run: shared within that run only.
        1: read_rollouts(
            write_rollouts(
                tmp_path / "r1", RolloutBatch("r1", 0, 0, completions(prompt, group[:2]))
            )
        ),
    }
    whole = pack_batches(batches, seq_len=512, max_runs=2)
    (row,) = pack_batches(batches, seq_len=512, max_runs=2, share_prompts=True)
    # The first completion whole, each next one from the prompt's last token: 23 + 7 x 11.
    assert row.lora_num_tokens.tolist() == [100, 23 + 11]
    assert row.position_ids[23:34].tolist() == list(range(12, 23))
    packed = PackedSequences.from_position_ids(row.position_ids, "cpu")
    assert packed.lengths == (23, *[11] * 7, 23, 11)
    assert packed.shared_starts == (0,) * 8 + (100, 100)
    assert packed.shared_lengths == (0, *[12] * 7, 0, 12)
    assert trained_tokens([row]) == trained_tokens(whole)
    assert row.run_loss_tokens.tolist() == whole[0].run_loss_tokens.tolist() == [80, 20]


def test_a_group_cut_by_the_end_of_a_row_packs_its_first_completion_of_the_next_row_whole(
    tmp_path: Path,
):
    prompt = list(range(3, 16))
    group = [[20 + i] * 10 for i in range(5)]
    batch = read_rollouts(
        write_rollouts(tmp_path, RolloutBatch("r0", 0, 0, completions(prompt, group)))
    )
    rows = pack_batches({0: batch}, seq_len=50, max_runs=1, share_prompts=True)
    assert [row.num_tokens for row in rows] == [23 + 11 + 11, 23 + 11]
    assert rows[1].position_ids[:23].tolist() == list(range(23))
    assert trained_tokens(rows) == trained_tokens(pack_batches({0: batch}, seq_len=50, max_runs=1))


def test_a_branch_never_reads_as_the_continuation_of_the_sample_before_it(tmp_path: Path):
    # Completions that share untrained tokens past the prompt share them too. Here the third
    # would start at the position where the second ends, which would read as one sample.
    untrained = [False, False, False, False, True]
    samples = completions(
        [1, 2],
        [[5, 6, 7, 8, 9], [5, 6, 7], [5, 6, 7, 8, 9]],
        [untrained, [False, False, True], untrained],
    )
    batch = read_rollouts(write_rollouts(tmp_path, RolloutBatch("r0", 0, 0, samples)))
    (row,) = pack_batches({0: batch}, seq_len=64, max_runs=1, share_prompts=True)
    packed = PackedSequences.from_position_ids(row.position_ids, "cpu")
    assert packed.shared_lengths == (0, 3, 4)
    assert trained_tokens([row]) == trained_tokens(pack_batches({0: batch}, 64, 1))
