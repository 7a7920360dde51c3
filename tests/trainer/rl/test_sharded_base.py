"""The base sharded over two torchrun ranks (FSDP2, gloo) trains what one rank trains, holds
half the base on each rank, and its checkpoints move between rank counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.helpers import assert_same_gradients, make_tiny_llama, random_batch
from tests.trainer.rl.test_multi_process import WORKER, experiment_with_batches, torchrun
from workbench.files.rollouts import write_rollouts

SHARDED = 'base_sharding="sharded"'


def train(nproc: int, experiment: Path, model: Path, out: Path, *settings: str) -> dict:
    """Train every batch left in `experiment` on `nproc` ranks; rank 0's record, adapters
    and the gradients its last update stepped from."""
    out.mkdir(parents=True, exist_ok=True)
    torchrun(nproc, str(WORKER), str(experiment), str(model), str(out), *settings)
    record = json.loads((out / "rank0.json").read_text())
    record["adapters"] = load_file(str(out / "rank0.safetensors"))
    record["gradients"] = load_file(str(out / "rank0.gradients.safetensors"))
    return record


def assert_same_adapters_but_near_zero_gradients(
    got: dict, want: dict, atol: float, lr: float
) -> None:
    """The adapters within `atol` (and 1e-4 of each element), but 1 % of the elements may
    be off by up to `lr`: those whose gradient is near 0, which Adam's normalised step
    moves by about lr either way, so that a sum in another order can move them by more
    than `atol` (measured: 4.9e-4 at lr 0.05, one element of 512, on one machine of two).
    A resume that lost the AdamW state or the step count is off beyond `atol` in most
    elements."""
    assert set(got) == set(want) and any(key.startswith("run_b/") for key in want)
    off = total = 0
    for key in want:
        difference = (got[key] - want[key]).abs()
        assert float(difference.max()) <= lr, key
        off += int((difference > atol + 1e-4 * want[key].abs()).sum())
        total += difference.numel()
    assert off <= 0.01 * total, f"{off} of {total} elements off by more than {atol}"


@pytest.mark.slow
def test_sharded_tied_model_with_full_logits_and_recomputation_matches_one_rank(tmp_path):
    # The paths around the sharded units: a tied LM head (the embedding matrix, gathered by
    # the root), the full-logits head instead of the chunked one, and decoder layers
    # recomputed in backward (gathered again for it).
    model = make_tiny_llama(tmp_path / "tied", tie_word_embeddings=True)
    settings = ("logprob_chunk_tokens=0", "activation_checkpointing=true")
    two = train(
        2,
        experiment_with_batches(tmp_path / "two", steps=1, lr=0.05),
        model,
        tmp_path / "out2",
        SHARDED,
        *settings,
    )
    one = train(
        1,
        experiment_with_batches(tmp_path / "one", steps=1, lr=0.05),
        model,
        tmp_path / "out1",
        *settings,
    )
    assert two["sharded"] and not one["sharded"]
    assert two["updates"] == one["updates"] == 1
    # Two ranks' gradients all-reduced sum in another order than one rank's.
    assert_same_gradients(two["gradients"], one["gradients"])
    assert any(key.startswith("run_b/") for key in one["gradients"])
    # Each rank holds half of every frozen weight (FSDP2 pads a dimension that does not
    # split evenly, so a little more than half in general).
    assert two["base_bytes"] <= 0.55 * one["base_bytes"]


@pytest.mark.slow
@pytest.mark.parametrize(("first", "then"), [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_ranks(tmp_path, first, then):
    # Adapters are whole on every rank and rank 0 writes them whole, so a run checkpointed
    # by the sharded trainer resumes on one rank, and the other way round, as if never
    # stopped.
    model = make_tiny_llama(tmp_path / "model")
    settings = {1: (), 2: (SHARDED,)}
    reference = train(
        1,
        experiment_with_batches(tmp_path / "ref", steps=2, lr=0.05, checkpoint_interval=1),
        model,
        tmp_path / "out_ref",
    )
    assert reference["updates"] == 2

    experiment = experiment_with_batches(tmp_path / "exp", steps=1, lr=0.05, checkpoint_interval=1)
    before = train(first, experiment, model, tmp_path / "out_first", *settings[first])
    assert before["updates"] == 1
    for name, seed in (("run_a", 1), ("run_b", 2)):
        write_rollouts(experiment / name, random_batch(name, 1, 10, seed=seed))
    after = train(then, experiment, model, tmp_path / "out_then", *settings[then])
    assert after["updates"] == 1
    # Two Adam steps: an element whose gradient is near zero moves by about lr either way,
    # so a sum in another order can move it by more than one step's 1e-5.
    assert_same_adapters_but_near_zero_gradients(
        after["adapters"], reference["adapters"], atol=2e-4, lr=0.05
    )
