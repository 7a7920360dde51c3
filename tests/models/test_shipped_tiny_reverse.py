"""builtin:tiny-reverse (and builtin:tiny-reverse-chat) ship their weights: every machine
trains on the same model, bit for bit.

How they were made (`build.json`'s `made_with` names the machine): on an AMD EPYC machine
with torch 2.13.0+cpu, `workbench model build builtin:tiny-reverse --from-scratch -o
workbench/models/weights/tiny-reverse`, i.e. `TinyReverse.build_from_scratch` on the
default `TinyReverseSpec`. Another processor's build gives other bits (and another model to
learn from), which is why the files ship rather than being built on first use.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workbench.envs import get_environment
from workbench.files import layout
from workbench.models import ModelResolutionError, resolve_model
from workbench.models import shipped as shipped_module
from workbench.models.shipped import file_sha256, read_build_info, verify
from workbench.trainer.sft.tiny_reverse import (
    TINY_REVERSE,
    TINY_REVERSE_CHAT,
    TinyReverse,
    TinyReverseSpec,
)
from workbench.trainer.sft.train import evaluate_greedy, load_model

SHIPPED_DIR = TINY_REVERSE.shipped_dir
BUILTINS = pytest.mark.parametrize(
    "builtin", [TINY_REVERSE, TINY_REVERSE_CHAT], ids=lambda b: b.name
)


@BUILTINS
def test_the_shipped_files_are_the_ones_their_build_json_records(builtin: TinyReverse):
    info = read_build_info(builtin.shipped_dir)
    assert info is not None and info["name"] == builtin.name
    assert set(info["sha256"]) >= {"config.json", "model.safetensors", "tokenizer.json"}
    for name, digest in info["sha256"].items():
        assert file_sha256(builtin.shipped_dir / name) == digest, name
    assert info["made_with"]["command"].startswith(f"workbench model build builtin:{builtin.name}")
    verify(builtin.shipped_dir)


@BUILTINS
def test_the_default_spec_is_the_one_the_shipped_weights_were_built_from(builtin: TinyReverse):
    # A changed default (warm-up steps, seed, sizes) must come with weights built from it:
    # rebuild them with the command in build.json's made_with.
    assert builtin.ships(builtin.default_spec())
    assert not builtin.ships(builtin.default_spec().model_copy(update={"seed": 1}))
    assert TINY_REVERSE.ships(TinyReverseSpec())


def test_the_shipped_model_scores_what_its_build_measured():
    """Greedy decoding of a fixed model barely depends on the processor: the reward the
    build recorded on held-out 8-14 letter prompts is what this machine measures."""
    info = read_build_info(SHIPPED_DIR)
    spec = TinyReverseSpec.model_validate(info["spec"])
    tokenizer, model = load_model(SHIPPED_DIR)
    model.eval()
    measured = evaluate_greedy(
        model, tokenizer, get_environment("reverse_text"), n=spec.eval_prompts, seed=spec.seed
    ).mean_reward
    assert measured == pytest.approx(info["greedy_reward"]["rl (8-14 letters)"], abs=0.02)


def test_first_use_copies_the_shipped_weights_bit_for_bit_without_training(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    def no_training(*args, **kwargs):
        raise AssertionError("the default spec's weights are shipped, not trained")

    monkeypatch.setattr("workbench.trainer.sft.train.train_sft", no_training)
    model = resolve_model("builtin:tiny-reverse", show_progress=False)
    assert model.parent == cache_dir / "models" and layout.is_stable(model)
    assert file_sha256(model / "model.safetensors") == file_sha256(
        SHIPPED_DIR / "model.safetensors"
    )
    assert resolve_model("builtin:tiny-reverse") == model


def test_damaged_shipped_weights_are_refused_and_leave_no_model_in_the_cache(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    damaged = tmp_path / "weights" / "tiny-reverse"
    shutil.copytree(SHIPPED_DIR, damaged)
    data = bytearray((damaged / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (damaged / "model.safetensors").write_bytes(bytes(data))
    monkeypatch.setattr(TINY_REVERSE, "shipped_dir", damaged)
    with pytest.raises(ModelResolutionError, match=r"damaged .*model\.safetensors.*reinstall"):
        resolve_model("builtin:tiny-reverse", show_progress=False)
    assert [p for p in (cache_dir / "models").iterdir() if p.is_dir()] == []


def test_a_build_from_scratch_records_its_files_and_the_machine_that_made_it(
    tmp_path: Path, small_spec: TinyReverseSpec
):
    from rich.console import Console

    target = tmp_path / "built"
    target.mkdir()
    TINY_REVERSE.build_from_scratch(
        target, small_spec, show_progress=False, console=Console(stderr=True)
    )
    info = shipped_module.record_shipment(target, "test")
    verify(target)
    assert info["made_with"]["torch"] and info["made_with"]["processor"]
    assert info["spec"] == small_spec.model_dump(mode="json")


def test_a_build_warms_up_on_and_measures_the_environment_its_spec_names(
    tmp_path: Path, small_spec: TinyReverseSpec, monkeypatch: pytest.MonkeyPatch
):
    """The builder is not tied to reverse_text: a counting model (letter_count) is built by
    the same code, trained and measured on letter_count's prompts."""
    from rich.console import Console

    import workbench.trainer.sft.train as sft_train

    warmed_up_on = []
    real_train_sft = sft_train.train_sft

    def recording_train_sft(config, **kwargs):
        warmed_up_on.append((config.env, config.env_args))
        return real_train_sft(config, **kwargs)

    monkeypatch.setattr(sft_train, "train_sft", recording_train_sft)
    spec = small_spec.model_copy(
        update={"warmup_env": "letter_count", "warmup_env_args": {"max_length": 5}}
    )
    target = tmp_path / "built"
    target.mkdir()
    TinyReverse("tiny-count", spec).build_from_scratch(
        target, spec, show_progress=False, console=Console(stderr=True)
    )
    assert warmed_up_on == [("letter_count", {"max_length": 5})]
    # letter_count's lengths (3-5 warming up, its default 3-10 for RL), not reverse_text's.
    assert set(read_build_info(target)["greedy_reward"]) == {
        "warmup (3-5 letters)",
        "rl (3-10 letters)",
    }
