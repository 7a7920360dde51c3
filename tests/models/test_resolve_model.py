"""resolve_model: `builtin:tiny-reverse` is built once into the cache and then reused; local
paths and hub ids pass through; a failed or concurrent build never leaves a broken model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from workbench.files import layout
from workbench.models import ModelResolutionError, builtin_model_dir, resolve_model
from workbench.models.build_progress import BuildProgressFile, read_build_progress
from workbench.trainer.sft.tiny_reverse import TINY_REVERSE, TinyReverseSpec

MODEL_FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "build.json",
}


def test_local_paths_and_hub_ids_pass_through_unchanged(tmp_path: Path):
    assert resolve_model(str(tmp_path)) == tmp_path
    assert str(resolve_model("Qwen/Qwen3-0.6B")) == "Qwen/Qwen3-0.6B"


def test_an_unknown_builtin_names_the_available_ones(cache_dir: Path):
    with pytest.raises(ModelResolutionError, match="builtin:tiny-reverse"):
        resolve_model("builtin:huge-model")


def test_a_builtin_is_built_once_into_the_cache_and_then_reused(
    cache_dir: Path, small_spec: TinyReverseSpec, monkeypatch: pytest.MonkeyPatch
):
    built = resolve_model("builtin:tiny-reverse", spec=small_spec, show_progress=False)
    assert built.parent == cache_dir / "models"
    assert built.name == f"tiny-reverse-{TINY_REVERSE.version_hash(small_spec)}"
    assert {p.name for p in built.iterdir()} >= MODEL_FILES
    assert layout.is_stable(built)
    assert [p.name for p in built.parent.iterdir() if p.is_dir()] == [built.name]

    config = AutoConfig.from_pretrained(built)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("llama", 32, 2)
    tokenizer = AutoTokenizer.from_pretrained(built)
    assert tokenizer.apply_chat_template(
        [{"role": "user", "content": "ab"}], add_generation_prompt=True, tokenize=False
    ).endswith("<|assistant|>")
    info = json.loads((built / "build.json").read_text())
    assert info["params"] > 0 and info["spec"]["warmup_steps"] == small_spec.warmup_steps
    assert set(info["greedy_reward"]) == {"warmup (3-8 letters)", "rl (8-14 letters)"}

    def no_second_build(*args, **kwargs):
        raise AssertionError("a cached model must not be rebuilt")

    monkeypatch.setattr(TINY_REVERSE, "build", no_second_build)
    assert resolve_model("builtin:tiny-reverse", spec=small_spec) == built


def test_a_build_reports_each_step_to_the_experiment_and_a_cached_model_reports_none(
    cache_dir: Path, small_spec: TinyReverseSpec, tmp_path: Path
):
    experiment = tmp_path / "experiment"
    seen = []
    with BuildProgressFile(experiment, "builtin:tiny-reverse") as writer:

        def on_step(step: int, steps: int, what: str) -> None:
            writer(step, steps, what)
            seen.append(read_build_progress(experiment))

        resolve_model("builtin:tiny-reverse", spec=small_spec, show_progress=False, on_step=on_step)
    assert [(p.step, p.steps) for p in seen] == [(1, 3), (2, 3), (2, 3), (3, 3)]
    assert [p.what for p in seen] == [
        "initial weights from seed 0",
        "warm-up update 0 of 3",
        f"warm-up update 3 of 3 (loss {seen[2].what.rsplit(' ', 1)[-1]}",
        "greedy reward on 2 x 4 held-out prompts",
    ]
    assert {(p.model, p.pid, p.started_at) for p in seen} == {
        ("builtin:tiny-reverse", os.getpid(), seen[0].started_at)
    }
    assert read_build_progress(experiment) is None, "the file goes when the build is over"

    seen.clear()
    resolve_model("builtin:tiny-reverse", spec=small_spec, on_step=on_step)
    assert seen == [] and read_build_progress(experiment) is None


def test_the_cache_directory_is_keyed_by_the_spec(cache_dir: Path, small_spec: TinyReverseSpec):
    other = small_spec.model_copy(update={"seed": 1})
    assert builtin_model_dir("builtin:tiny-reverse", small_spec) != builtin_model_dir(
        "builtin:tiny-reverse", other
    )
    assert builtin_model_dir("builtin:tiny-reverse").name.startswith("tiny-reverse-")


def test_a_failed_build_leaves_nothing_behind(
    cache_dir: Path, small_spec: TinyReverseSpec, monkeypatch: pytest.MonkeyPatch
):
    def crash(target: Path, *args, **kwargs):
        (target / "config.json").write_text("{}")  # half-written when it dies
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(TINY_REVERSE, "build", crash)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        resolve_model("builtin:tiny-reverse", spec=small_spec, show_progress=False)
    leftovers = [p for p in (cache_dir / "models").iterdir() if p.is_dir()]
    assert leftovers == []


def test_leftovers_of_a_killed_build_are_removed_by_the_next_build(
    cache_dir: Path, small_spec: TinyReverseSpec
):
    final = builtin_model_dir("builtin:tiny-reverse", small_spec)
    final.parent.mkdir(parents=True)
    staging = final.parent / f".{final.name}.abc123.tmp"  # what a SIGKILL leaves
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"partial")
    final.mkdir()  # and a directory without its STABLE marker is not a model
    assert resolve_model("builtin:tiny-reverse", spec=small_spec, show_progress=False) == final
    assert not staging.exists()
    assert layout.is_stable(final)


def test_two_processes_resolving_at_once_build_only_once(
    cache_dir: Path, small_spec: TinyReverseSpec
):
    script = (
        "import sys; from workbench.models import resolve_model; "
        "from workbench.trainer.sft.tiny_reverse import TinyReverseSpec; "
        "spec = TinyReverseSpec.model_validate_json(sys.argv[1]); "
        "print(resolve_model('builtin:tiny-reverse', spec=spec, show_progress=False))"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, small_spec.model_dump_json()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    paths = {stdout.strip() for stdout, _ in outputs}
    assert paths == {str(builtin_model_dir("builtin:tiny-reverse", small_spec))}
    builds = sum(stderr.count("building builtin:tiny-reverse (first use") for _, stderr in outputs)
    assert builds == 1, outputs


def test_a_cached_builtin_resolves_without_importing_torch_or_transformers(cache_dir: Path):
    # vLLM's launcher resolves the model before every start; importing the build's stack
    # for a model already in the cache cost it 6-8 s on the 2-core machine.
    cached = resolve_model("builtin:tiny-reverse", show_progress=False)  # the shipped weights
    script = (
        "import sys; from workbench.models import resolve_model; "
        "print(resolve_model('builtin:tiny-reverse')); "
        "print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.splitlines() == [str(cached), "[]"], result.stderr
