"""Training loops written only against the public `tinker` SDK (0.38.0), run against a real
`workbench serve` of the built-in tiny model: vLLM samples, the shared torchrun trainer
computes the losses and steps the adapter.

- an RL loop in the shape of tinker-cookbook's `recipes/rl_loop.py` (groups sampled from
  the current weights, centred rewards, `importance_sampling`, AdamW) learns reverse_text;
- a supervised loop with `cross_entropy` on local rows lowers its loss.

Nothing workbench-specific is imported in the loops themselves except the environment, whose
prompts and reward are what a native reverse_text run uses."""

from __future__ import annotations

import json
import math
import statistics
import time

import httpx
import numpy as np
import pytest
import tinker
import torch

from tests.tinker.conftest import BUILTIN, Served, datum, sdk_client, serve
from workbench.envs.registry import get_environment
from workbench.files import run_control

pytestmark = pytest.mark.slow

KEY = "tml-sdk-loops-0123456789abcdef"
# recipes/reverse_text.toml's problem (9 letters, rank 8, alpha 16, lr 3e-3, 16 prompts x 8),
# with one native run of a single small step beside the SDK's (a recipe needs a run).
RECIPE = f"""\
[experiment]
name = "sdk-loops"
output_dir = "outputs/sdk-loops"
[model]
base = "{BUILTIN}"
[inference]
max_loras = 4
[trainer]
max_concurrent_runs = 4
lora = {{ rank = 8, alpha = 16 }}
[defaults]
env = "reverse_text"
env_args = {{ min_length = 9, max_length = 9 }}
max_steps = 1
batch_size = 8
rollouts_per_prompt = 4
eval = {{ interval = 0 }}
[[runs]]
id = "native"
"""
ENV_ARGS = {"min_length": 9, "max_length": 9}
PROMPTS, GROUP, LR, MAX_TOKENS = 16, 8, 3e-3, 64
RL_STEPS = 16


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    yield from serve(RECIPE, tmp_path_factory.mktemp("sdk-loops"), KEY)


@pytest.fixture(scope="module")
def service(served):
    with sdk_client(served.url, served.api_key) as client:
        yield client


def prompt_tokens(tokenizer, prompt) -> list[int]:
    """The prompt as the orchestrator sends it: the environment's chat through the model's
    chat template, opened for the assistant's reply."""
    return list(
        tokenizer.apply_chat_template(
            prompt.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


def rl_datum(prompt_ids: list[int], sequence, advantage: float):
    """One sampled completion as rl_loop.py makes its datum: the model reads the prompt and
    the completion but its last token, with the sampler's logprobs and the group-centred
    advantage (0 on the prompt). The targets are the next tokens everywhere, as the
    cookbook's rl.train sends them (rl_loop.py writes 0 under the prompt, which the
    trainer refuses: it scores only next-token targets)."""
    tokens = list(sequence.tokens)
    observed = len(prompt_ids) - 1
    return tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(prompt_ids + tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": prompt_ids[1:] + tokens,
            "logprobs": [0.0] * observed + list(sequence.logprobs),
            "advantages": [0.0] * observed + [advantage] * len(tokens),
        },
    )


def rl_step(training, tokenizer, env, step: int, adam) -> float:
    """One rl_loop step: sample from the current weights, reward, centre, train. Returns
    the mean reward of its samples."""
    sampler = training.save_weights_and_get_sampling_client().result(timeout=600)
    params = tinker.types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)
    prompts = [env.prompt(step * PROMPTS + i, seed=0) for i in range(PROMPTS)]
    ids = [prompt_tokens(tokenizer, p) for p in prompts]
    futures = [
        sampler.sample(
            tinker.types.ModelInput.from_ints(i),
            GROUP,
            params,
        )
        for i in ids
    ]
    datums, rewards = [], []
    for prompt, prompt_ids, future in zip(prompts, ids, futures, strict=True):
        sequences = future.result(timeout=600).sequences
        group = [
            env.reward(prompt, tokenizer.decode(s.tokens, skip_special_tokens=True))
            for s in sequences
        ]
        rewards += group
        mean = statistics.fmean(group)
        if all(r == mean for r in group):
            continue  # no signal in this group, as rl_loop.py skips it
        datums += [rl_datum(prompt_ids, s, r - mean) for s, r in zip(sequences, group, strict=True)]
    if datums:
        backward = training.forward_backward(datums, "importance_sampling")
        optim = training.optim_step(adam)
        backward.result(timeout=600)
        optim.result(timeout=600)
    return statistics.fmean(rewards)


def test_a_session_beyond_the_trainers_slots_waits_for_one_then_trains(served, service):
    """First in the module, so that every slot is free once the native run has finished:
    4 clients take the trainer's 4 slots; a fifth's forward_backward waits (the SDK hears
    try-again) while theirs are answered, and is answered once one of them unloads."""
    native = served.experiment / "run_native"
    deadline = time.monotonic() + 300
    while not run_control.is_finished(native) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert run_control.is_finished(native), "the native run holds a slot still"
    holders = [
        service.create_lora_training_client(base_model=BUILTIN, rank=4).result(timeout=60)
        for _ in range(4)
    ]
    for training in holders:
        training.forward_backward([datum([5, 6, 7])], "cross_entropy").result(timeout=300)
    waiting = service.create_lora_training_client(base_model=BUILTIN, rank=4).result(timeout=60)
    queued = waiting.forward_backward([datum([5, 6, 7])], "cross_entropy")
    with pytest.raises(TimeoutError):
        queued.result(timeout=5)  # the trainer passes every 10 ms: it is waiting for a slot
    # The route this SDK release never calls, raw, as the cookbook's clients would leave.
    unload = httpx.post(
        f"{served.url}/api/v1/unload_model",
        json={"model_id": holders[0].model_id},
        headers={"X-API-Key": served.api_key},
    )
    assert unload.status_code == 200, unload.text
    assert queued.result(timeout=120).loss_fn_outputs
    for training in [*holders[1:], waiting]:
        httpx.post(
            f"{served.url}/api/v1/unload_model",
            json={"model_id": training.model_id},
            headers={"X-API-Key": served.api_key},
        ).raise_for_status()


def test_an_rl_loop_on_the_public_sdk_learns_reverse_text(service):
    training = service.create_lora_training_client(base_model=BUILTIN, rank=8, seed=0).result(
        timeout=120
    )
    tokenizer = training.get_tokenizer()
    env = get_environment("reverse_text", **ENV_ARGS)
    adam = tinker.types.AdamParams(learning_rate=LR, beta1=0.9, beta2=0.999, eps=1e-8)
    curve = [rl_step(training, tokenizer, env, step, adam) for step in range(RL_STEPS)]
    print("reward per step:", " ".join(f"{r:.3f}" for r in curve))
    first, last = statistics.fmean(curve[:3]), statistics.fmean(curve[-3:])
    # Measured (2 CPU cores, 2026-12-07): 0.571 0.685 0.725 ... 0.869 0.854 0.864, first
    # three 0.66, last three 0.86; a native run of recipes/reverse_text.toml goes 0.65 -> 0.87
    # in 40 steps. A rise of 0.1 leaves half of it to sampling noise.
    assert last > first + 0.1, curve


def sft_datum(tokenizer, prompt):
    """A prompt and its reference answer, the answer's tokens weighted 1 (the chat
    template closes a reply with EOS, which is a target too)."""
    prompt_ids = prompt_tokens(tokenizer, prompt)
    answer = tokenizer.encode(prompt.answer, add_special_tokens=False)
    tokens = prompt_ids + answer + [tokenizer.eos_token_id]
    weights = [0.0] * (len(prompt_ids) - 1) + [1.0] * (len(answer) + 1)
    return tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


def test_a_supervised_loop_with_cross_entropy_lowers_its_loss(service):
    training = service.create_lora_training_client(base_model=BUILTIN, rank=8, seed=1).result(
        timeout=120
    )
    tokenizer = training.get_tokenizer()
    env = get_environment("reverse_text", **ENV_ARGS)
    datums = [sft_datum(tokenizer, env.prompt(i, seed=1)) for i in range(PROMPTS)]
    answer_tokens = sum(float(np.sum(d.loss_fn_inputs["weights"].data)) for d in datums)
    adam = tinker.types.AdamParams(learning_rate=2e-3)
    losses = []
    for _ in range(10):
        backward = training.forward_backward(datums, "cross_entropy")
        training.optim_step(adam).result(timeout=600)
        outputs = backward.result(timeout=600).loss_fn_outputs
        nll = -sum(
            float(np.dot(o["logprobs"].data, d.loss_fn_inputs["weights"].data))
            for o, d in zip(outputs, datums, strict=True)
        )
        losses.append(nll / answer_tokens)
    print("loss per answer token:", " ".join(f"{loss:.3f}" for loss in losses))
    assert losses[-1] < 0.7 * losses[0], losses
    assert all(math.isfinite(loss) for loss in losses)


def test_forward_backward_custom_trains_on_a_loss_computed_by_the_client(service):
    """The SDK's `forward_backward_custom`: a `forward`, the client's own loss and its
    gradient on the log-probs, then a weighted `cross_entropy` carrying that gradient. The
    loss here is the squared distance of each answer token's log-prob from -0.1 (no
    built-in loss has it): it falls as the adapter trains."""
    training = service.create_lora_training_client(base_model=BUILTIN, rank=8, seed=2).result(
        timeout=120
    )
    tokenizer = training.get_tokenizer()
    env = get_environment("reverse_text", **ENV_ARGS)
    datums = [sft_datum(tokenizer, env.prompt(i, seed=2)) for i in range(4)]

    def squared_distance(data, logprobs):
        terms = [
            (torch.as_tensor(d.loss_fn_inputs["weights"].data) * (lp + 0.1) ** 2).sum()
            for d, lp in zip(data, logprobs, strict=True)
        ]
        loss = torch.stack(terms).sum()
        return loss, {"squared_distance": float(loss)}

    adam = tinker.types.AdamParams(learning_rate=3e-3)
    losses = []
    for _ in range(6):
        result = training.forward_backward_custom(datums, squared_distance).result(timeout=600)
        training.optim_step(adam).result(timeout=600)
        losses.append(result.metrics["squared_distance"])
    print("custom loss:", " ".join(f"{loss:.3f}" for loss in losses))
    assert losses[-1] < 0.8 * losses[0], losses


# ---------------------------------------------------------------- tinker-cookbook's driver


def cookbook_reverse_text():
    """A reverse_text Env, EnvGroupBuilder, RLDataset and RLDatasetBuilder on the cookbook's
    interfaces, the built-in tokenizer registered under the model's name (the cookbook would
    otherwise ask the hub for it). The Env renders its prompt with the model's own chat
    template: none of the cookbook's renderers writes the built-in model's template."""
    import chz
    from tinker_cookbook import tokenizer_utils
    from tinker_cookbook.rl import types as rl

    from workbench.models.resolve import resolve_model

    if not tokenizer_utils.is_tokenizer_registered(BUILTIN):
        from transformers import AutoTokenizer

        path = str(resolve_model(BUILTIN))
        tokenizer_utils.register_tokenizer(BUILTIN, lambda: AutoTokenizer.from_pretrained(path))
    tokenizer = tokenizer_utils.get_tokenizer(BUILTIN)
    env = get_environment("reverse_text", **ENV_ARGS)
    stop = [tokenizer.eos_token_id]

    class ReverseTextEnv(rl.Env):
        def __init__(self, prompt) -> None:
            self.prompt = prompt

        async def initial_observation(self):
            ids = prompt_tokens(tokenizer, self.prompt)
            return tinker.types.ModelInput.from_ints(ids), stop

        async def step(self, action, *, extra=None):
            text = tokenizer.decode(action, skip_special_tokens=True)
            reward = env.reward(self.prompt, text)
            return rl.StepResult(
                reward=reward,
                episode_done=True,
                next_observation=tinker.types.ModelInput.empty(),
                next_stop_condition=stop,
                metrics={"similarity": reward},
            )

    class Group(rl.EnvGroupBuilder):
        def __init__(self, index: int) -> None:
            self.index = index

        async def make_envs(self):
            return [ReverseTextEnv(env.prompt(self.index, seed=2)) for _ in range(GROUP)]

        def logging_tags(self):
            return ["reverse_text"]

    class Dataset(rl.RLDataset):
        def __init__(self, batches: int) -> None:
            self.batches = batches

        def get_batch(self, index: int):
            return [Group(index * PROMPTS + i) for i in range(PROMPTS)]

        def __len__(self) -> int:
            return self.batches

    @chz.chz
    class DatasetBuilder(rl.RLDatasetBuilder):
        batches: int

        async def __call__(self):
            return Dataset(self.batches), None

    return DatasetBuilder


def test_tinker_cookbooks_rl_driver_trains_against_the_service(served, tmp_path, monkeypatch):
    import asyncio

    import tinker
    from tinker_cookbook.rl import train

    # The driver never closes the ServiceClient it makes: its heartbeat thread then warned
    # after the suite's summary that the (stopped) service was gone. Closed here, after it.
    made: list[tinker.ServiceClient] = []

    class ClosedAfterwards(tinker.ServiceClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(tinker, "ServiceClient", ClosedAfterwards)
    monkeypatch.setenv("TINKER_API_KEY", served.api_key)
    steps = 3
    config = train.Config(
        learning_rate=LR,
        dataset_builder=cookbook_reverse_text()(batches=steps),
        model_name=BUILTIN,
        recipe_name="workbench_reverse_text",
        max_tokens=MAX_TOKENS,
        log_path=str(tmp_path / "cookbook"),
        eval_every=0,
        save_every=0,
        lora_rank=8,
        base_url=served.url,
    )
    try:
        asyncio.run(train.main(config))
    finally:
        for client in made:
            client.close("success").result(timeout=60)
    assert made, "the driver made no ServiceClient through tinker.ServiceClient"
    lines = (tmp_path / "cookbook" / "metrics.jsonl").read_text().splitlines()
    rewards = [
        row["env/all/reward/total"]
        for row in map(json.loads, lines)
        if row.get("env/all/reward/total") is not None
    ]
    print("cookbook reward per step:", " ".join(f"{r:.3f}" for r in rewards))
    assert len(rewards) == steps and all(0.0 < r <= 1.0 for r in rewards), lines
