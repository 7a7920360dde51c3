"""Small models for fast tests: the real build code with a much smaller spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.trainer.sft.tiny_reverse import TinyReverseSpec, write_initial_model

# A few thousand parameters: builds and trains in seconds, same code path as the real one.
SMALL_SPEC = TinyReverseSpec(
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=2,
    max_position_embeddings=128,
    warmup_steps=3,
    batch_size=8,
    lr=3e-3,
    eval_prompts=4,
)


@pytest.fixture
def small_spec() -> TinyReverseSpec:
    return SMALL_SPEC


@pytest.fixture(scope="session")
def untrained_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded, untrained small Llama with the character tokenizer and chat template."""
    directory = tmp_path_factory.mktemp("untrained-small")
    write_initial_model(directory, SMALL_SPEC)
    return directory


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private model cache: builds in a test never touch the user's cache."""
    path = tmp_path / "cache"
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(path))
    return path
