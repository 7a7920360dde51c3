"""Small builders shared by tests (importable as `tests.helpers`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workbench.system.polling import wait_until


def wait_for(
    condition: Callable[[], Any],
    timeout_s: float = 10.0,
    what: str = "condition",
    every_s: float = 0.02,
) -> Any:
    """`wait_until` that fails the test, naming `what`, instead of raising TimeoutError."""
    try:
        return wait_until(condition, timeout_s, what, every_s)
    except TimeoutError as error:
        pytest.fail(str(error))


def make_run(experiment: Path, run_id: str, orch_toml: str = "") -> Path:
    """A run directory as the handshake leaves it: `control/orch.toml` written."""
    control = experiment / run_id / "control"
    control.mkdir(parents=True, exist_ok=True)
    (control / "orch.toml").write_text(orch_toml)
    return experiment / run_id


def age_files(root: Path, seconds: float = 60.0) -> None:
    """Date every file and directory under `root` `seconds` back. Readers that skip
    unchanged files re-read one changed too recently to tell (`workbench.system.file_change`);
    files written that long ago have settled, as a finished run's have."""
    past = time.time() - seconds
    for path in [root, *root.rglob("*")]:
        os.utime(path, (past, past))


def autogroup_nice(pid: int) -> int | None:
    """The nice value of process `pid`'s session's autogroup; None without autogroup, and
    for a process of the boot session's group (no setsid since boot: a CI runner's, a
    container's init), whose file is empty and whose priority no process can change."""
    try:
        fields = Path(f"/proc/{pid}/autogroup").read_text().split()
    except OSError:
        return None
    return int(fields[-1]) if fields else None


def make_tiny_llama(directory: Path, seed: int = 0, *, tie_word_embeddings: bool = False) -> Path:
    """A randomly initialised Llama small enough for CPU tests (no download); with tied
    embeddings the LM head is the embedding matrix, as in Qwen3's smaller models."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=256,
        tie_word_embeddings=tie_word_embeddings,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def random_adapter(model_dir: Path, directory: Path, seed: int) -> Path:
    """A strong random rank-8 adapter of `model_dir`, written (STABLE) to `directory`: enough
    to change greedy completions."""
    import torch
    from transformers import AutoModelForCausalLM

    from workbench.config import LORA_TARGET_MODULES
    from workbench.trainer.runs.broadcast import write_adapter

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in LORA_TARGET_MODULES:
            state[f"{name}.lora_A.weight"] = (
                torch.randn(8, module.in_features, generator=generator) * 0.3
            )
            state[f"{name}.lora_B.weight"] = (
                torch.randn(module.out_features, 8, generator=generator) * 0.3
            )
    return write_adapter(
        directory,
        state,
        rank=8,
        alpha=16,
        target_modules=list(LORA_TARGET_MODULES),
        base_model=str(model_dir),
    )


def random_batch(run_id: str, step: int, n: int, seed: int, vocab: int = 64):
    """A rollout batch of `n` samples with varied lengths and advantages."""
    import random

    from workbench.files.rollouts import RolloutBatch, Sample

    rng = random.Random(f"{run_id}-{step}-{seed}")
    samples = []
    for _ in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 6))]
        completion = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 8))]
        samples.append(
            Sample(
                prompt_ids=prompt,
                completion_ids=completion,
                completion_logprobs=[-rng.uniform(0.5, 4.0) for _ in completion],
                advantage=rng.uniform(-1, 1),
                reward=rng.random(),
            )
        )
    return RolloutBatch(run_id, step, max(0, step - 1), samples)


def random_multi_turn_batch(run_id: str, step: int, n: int, seed: int, vocab: int = 64):
    """A rollout batch of `n` two-turn episodes: prompt, the model's turn, a message the
    environment added, the model's second turn, and the environment's closing message.
    Only the model's turns are trained (`completion_mask`); the environment's tokens carry
    log-prob 0, as an orchestrator writes them."""
    import random

    from workbench.files.rollouts import RolloutBatch, Sample

    rng = random.Random(f"{run_id}-{step}-{seed}-turns")
    samples = []
    for _ in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 5))]
        completion, mask, logprobs = [], [], []
        for by_model, low, high in ((True, 1, 5), (False, 1, 4), (True, 1, 5), (False, 1, 3)):
            for _ in range(rng.randint(low, high)):
                completion.append(rng.randrange(3, vocab))
                mask.append(by_model)
                logprobs.append(-rng.uniform(0.5, 4.0) if by_model else 0.0)
        samples.append(
            Sample(
                prompt_ids=prompt,
                completion_ids=completion,
                completion_logprobs=logprobs,
                advantage=rng.uniform(-1, 1),
                reward=rng.random(),
                completion_mask=mask,
            )
        )
    return RolloutBatch(run_id, step, max(0, step - 1), samples)


def gradients_at_each_update(trainer) -> dict:
    """Filled, at each update the trainer makes, with the gradients that update steps from:
    `{run_id}/{param}` of every run ready to update, after the ranks' all-reduce and
    before clipping. An update's entries replace the one's before."""
    seen: dict = {}
    step = trainer.optimizer.step
    manager = trainer.manager

    def step_and_keep_gradients():
        seen.clear()
        for idx in manager.ready_to_update_idxs:
            for name, param in manager.get_named_parameters_for_run(idx):
                seen[f"{manager.idx_2_id[idx]}/{name}"] = param.grad.detach().clone()
        return step()

    trainer.optimizer.step = step_and_keep_gradients
    return seen


def assert_same_gradients(got: dict, want: dict, rtol: float = 1e-5) -> None:
    """Equal to `rtol` of each tensor's largest gradient.

    Used where two paths sum the same float32 terms in another order (another packing,
    two ranks all-reduced). Their gradients agree to rounding; the adapters after AdamW's
    first update do not always, because that update divides each gradient by its own size:
    where one is near AdamW's eps (1e-8), the last bits of rounding, which differ between
    CPUs, become a thousandth of the learning rate or more. A tensor whose gradients are all
    0 (each lora_A at the first update, where every lora_B is 0) must be 0 on both paths.
    """
    import torch

    assert set(got) == set(want), sorted(set(got) ^ set(want))
    assert any(tensor.abs().max() > 0 for tensor in want.values()), "no gradient at all"
    for key, expected in want.items():
        scale = float(expected.abs().max())
        torch.testing.assert_close(got[key], expected, rtol=0, atol=rtol * scale, msg=key)


def served_models(endpoint) -> list[str]:
    """The model names the inference server lists (`GET /v1/models`): the base model and every
    adapter version loaded now."""
    import httpx

    response = httpx.get(
        f"{endpoint.base_url}/models",
        headers={"Authorization": f"Bearer {endpoint.api_key}"},
        timeout=30,
    )
    response.raise_for_status()
    return [model["id"] for model in response.json()["data"]]


BUILTIN_BASE = "builtin:tiny-reverse"


def make_experiment(
    root: Path,
    name: str,
    defaults: str,
    runs: str,
    base: str = BUILTIN_BASE,
    env: str = "reverse_text",
) -> Path:
    """An experiment directory as `workbench up` writes it, under root/outputs/NAME."""
    from workbench.experiment import create_experiment
    from workbench.up import read_recipe

    recipe = root / f"{name}.toml"
    recipe.write_text(
        f'[experiment]\nname = "{name}"\noutput_dir = "{root / "outputs" / name}"\n\n'
        f'[model]\nbase = "{base}"\n\n'
        f'[defaults]\nenv = "{env}"\nmax_steps = 30\n{defaults}\n{runs}'
    )
    document, resolved = read_recipe(recipe)
    return create_experiment(resolved, document)


def record_evals(experiment: Path, run_id: str, *points: tuple[int, float]) -> None:
    """Eval records of `points` (step, eval_reward_mean), and the reward 0.05 below each,
    written by the orchestrator's own writer."""
    from workbench.files import layout
    from workbench.files.metrics import append_metrics

    run = layout.run_dir(experiment, run_id)
    for step, value in points:
        append_metrics(run, "orchestrator", step, reward_mean=value - 0.05)
        append_metrics(run, "eval", step, eval_reward_mean=value)


def keep_trainer_checkpoint(experiment: Path, run_id: str, step: int) -> None:
    """The trainer's part of a checkpoint, as the trainer leaves it (STABLE)."""
    import json

    from workbench.files import layout

    part = layout.checkpoint_part_dir(layout.run_dir(experiment, run_id), step, "trainer")
    with layout.staged_directory(part) as staged:
        (staged / "progress.json").write_text(json.dumps({"step": step}))


def iterate_published(trainer) -> str:
    """One pass of the trainer's loop (`rl.iterate`), then every adapter it handed to its
    publisher written: what a test reads from broadcast/ right after an update. (The
    trainer itself goes on with its next update while they are written.)"""
    from workbench.trainer.rl.trainer import iterate, wait_for_publications

    outcome = iterate(trainer)
    if trainer.manager.is_master:
        wait_for_publications(trainer)
    return outcome
