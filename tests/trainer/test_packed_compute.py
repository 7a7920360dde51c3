"""How a packed row is computed: attention per sample, chunked LM head, activation
checkpointing. Each must give every sample exactly what it gets alone."""

from __future__ import annotations

import concurrent.futures
import contextlib
import unittest.mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.trainer.builders import DEVICE_DTYPES, build_trainer, tiny_causal_lm
from workbench.config import PROMPT_SHARING_ATTENTION, TrainerSection
from workbench.trainer.compute import attention, lm_head
from workbench.trainer.compute.attention import PackedSequences
from workbench.trainer.compute.attention_choice import AttentionRuntime, available_attention_paths
from workbench.trainer.compute.lm_head import chunked_token_logprobs, compute_logprobs
from workbench.trainer.compute.model import (
    apply_activation_checkpointing,
    decoder_layers,
    packed_row_logprobs,
    prepare_model,
)
from workbench.trainer.lora.layer import set_lora_num_tokens
from workbench.trainer.row_threads import torch_threads

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# CUDA's flex kernel needs heads of 16 or more; the CPU tests keep the tiny model's 8.
HEAD_DIM = {"cpu": 8, "cuda": 16}


def device_paths() -> list[tuple[str, str]]:
    """Every path that runs on each device here, in half precision or in float32."""
    pairs = []
    for device in DEVICES:
        paths = set()
        for dtype in (torch.bfloat16, torch.float32):
            runtime = AttentionRuntime.detect(device, dtype, HEAD_DIM[device])
            paths.update(available_attention_paths(runtime))
        pairs += [(device, path) for path in sorted(paths)]
    return pairs


def widest_dtype(device: str, path: str) -> torch.dtype:
    """float32 where `path` takes it on `device` (exact comparisons), else bfloat16."""
    runtime = AttentionRuntime.detect(device, torch.float32, HEAD_DIM[device])
    return torch.float32 if path in available_attention_paths(runtime) else torch.bfloat16


def random_samples(lengths, vocab: int = 64, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator) for n in lengths]


def packed(samples: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat(samples), torch.cat([torch.arange(len(s)) for s in samples])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize(("device", "path"), device_paths())
def test_every_attention_path_gives_each_sample_the_logprobs_it_gets_alone(device, path, family):
    # Half precision on CUDA, as GPU runs train; the CPU checks float32 exactly.
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tolerance = 3e-2 if dtype == torch.bfloat16 else 1e-5
    model = tiny_causal_lm(family, head_dim=HEAD_DIM[device]).to(device, dtype).eval()
    # Out of length order, some of similar length (batched, padded), some alone.
    samples = [s.to(device) for s in random_samples([5, 9, 16, 1, 8, 14, 7, 15])]
    temperatures = [1.0, 0.7, 1.0, 1.3, 0.5, 1.0, 0.9, 1.1]
    with torch.no_grad():
        alone = torch.cat(
            [
                compute_logprobs(model(input_ids=s[None]).logits[0], s, t)
                for s, t in zip(samples, temperatures, strict=True)
            ]
        )
        plan = prepare_model(model, TrainerSection(attention=path, logprob_chunk_tokens=4), device)
        input_ids, positions = packed(samples)
        per_token = torch.cat(
            [torch.full((len(s),), t) for s, t in zip(samples, temperatures, strict=True)]
        )
        together = packed_row_logprobs(model, plan, input_ids, positions, per_token.to(device))
    assert plan.attention == path
    # The first token of every sample predicts nothing of its own; only the rest count.
    first = torch.cat([torch.arange(len(s)) == 0 for s in samples]).to(device)
    torch.testing.assert_close(
        together[~first], alone[~first].float(), rtol=tolerance, atol=tolerance
    )


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize(("device", "path"), device_paths())
def test_every_attention_path_gives_each_sample_the_adapter_gradients_it_gets_alone(
    tmp_path, device, path, checkpointing
):
    dtype = widest_dtype(device, path)
    runs = {"run_a": "seed = 1\n", "run_b": "seed = 2\n"}
    model = build_trainer(tmp_path, runs, head_dim=HEAD_DIM[device]).model.to(device, dtype)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B starts at zero; adapters that change the forward test more
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
    # run_a's samples, then run_b's: the order of the routing counts.
    lengths = {0: [7, 3, 12], 1: [9, 5, 1]}
    samples = random_samples([n for slot in (0, 1) for n in lengths[slot]], seed=3)
    slots = [slot for slot in (0, 1) for _ in lengths[slot]]
    weights = [torch.randn(len(s), generator=generator) for s in samples]
    for w in weights:
        w[0] = 0  # a sample's first token is predicted from the sample before it

    def adapter_gradients() -> dict[str, torch.Tensor]:
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.requires_grad}
        model.zero_grad(set_to_none=True)
        return grads

    for sample, slot, w in zip(samples, slots, weights, strict=True):
        counts = [0, 0]
        counts[slot] = len(sample)
        set_lora_num_tokens(model, torch.tensor(counts))
        ids = sample.to(device)
        logprobs = compute_logprobs(model(input_ids=ids[None]).logits[0], ids)
        (logprobs * w.to(device)).sum().backward()
    alone = adapter_gradients()

    section = TrainerSection(attention=path, activation_checkpointing=checkpointing)
    plan = prepare_model(model, section, device)
    input_ids, positions = packed(samples)
    set_lora_num_tokens(model, torch.tensor([sum(lengths[0]), sum(lengths[1])]))
    ones = torch.ones(len(input_ids), device=device)
    logprobs = packed_row_logprobs(model, plan, input_ids.to(device), positions, ones)
    (logprobs * torch.cat(weights).to(device)).sum().backward()
    together = adapter_gradients()

    assert plan.attention == path and alone.keys() == together.keys()
    assert all(g.abs().sum() > 0 for n, g in alone.items() if "lora_B" in n)
    for name, grad in alone.items():
        if dtype == torch.float32:
            torch.testing.assert_close(together[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        else:  # bfloat16: compare the gradient as a whole
            error = (together[name] - grad).norm() / grad.norm().clamp_min(1e-12)
            assert error < 5e-2, f"{name}: relative error {error:.3g}"


def shared_prompt_rows(seed: int = 4):
    """Two runs' groups of completions, packed whole and with their prompts shared: (ids,
    positions, lora counts) of each layout, for each token of the shared layout the index
    of the same token in the whole one, and which tokens of the whole one are prompt's."""
    generator = torch.Generator().manual_seed(seed)
    groups = [(6, [4, 7, 3, 5]), (9, [2, 6])]  # (prompt length, completion lengths) per run
    whole_ids, whole_positions, shared_ids, shared_positions, index = [], [], [], [], []
    whole_counts, shared_counts, in_prompt = [], [], []
    start = 0
    for prompt_length, completions in groups:
        prompt = torch.randint(0, 64, (prompt_length,), generator=generator)
        whole_before, shared_before = sum(map(len, whole_ids)), sum(map(len, shared_ids))
        for i, length in enumerate(completions):
            sample = torch.cat([prompt, torch.randint(0, 64, (length,), generator=generator)])
            skip = 0 if i == 0 else prompt_length - 1  # the last prompt token stays its own
            whole_ids.append(sample)
            whole_positions.append(torch.arange(len(sample)))
            shared_ids.append(sample[skip:])
            shared_positions.append(torch.arange(skip, len(sample)))
            index.append(torch.arange(start + skip, start + len(sample)))
            in_prompt.append(torch.arange(len(sample)) < prompt_length)
            start += len(sample)
        whole_counts.append(sum(map(len, whole_ids)) - whole_before)
        shared_counts.append(sum(map(len, shared_ids)) - shared_before)
    whole = (torch.cat(whole_ids), torch.cat(whole_positions), torch.tensor(whole_counts))
    shared = (torch.cat(shared_ids), torch.cat(shared_positions), torch.tensor(shared_counts))
    return whole, shared, torch.cat(index), torch.cat(in_prompt)


@pytest.mark.parametrize(
    ("device", "path"), [(d, p) for d, p in device_paths() if p in PROMPT_SHARING_ATTENTION]
)
def test_completions_sharing_their_prompt_get_the_logprobs_and_gradients_they_get_whole(
    tmp_path, device, path
):
    dtype = widest_dtype(device, path)
    whole, shared, index, in_prompt = shared_prompt_rows()
    # A prompt token carries no loss; the completions' tokens do, each its own weight.
    weights = torch.linspace(-1, 1, len(whole[0]))
    weights[in_prompt] = 0
    results = []
    for name, (ids, positions, counts), kept in (
        ("whole", whole, torch.arange(len(whole[0]))),
        ("shared", shared, index),
    ):
        trainer = build_trainer(
            tmp_path / name,
            {"run_a": "seed = 1\n", "run_b": "seed = 2\n"},
            device=device,
            dtype=dtype,
            head_dim=HEAD_DIM[device],
        )
        with torch.no_grad():  # B starts at zero; adapters that change the forward test more
            generator = torch.Generator().manual_seed(1)
            for param_name, param in trainer.model.named_parameters():
                if "lora_B" in param_name:
                    param.copy_(0.05 * torch.randn(param.shape, generator=generator))
        plan = prepare_model(trainer.model, TrainerSection(attention=path), device)
        set_lora_num_tokens(trainer.model, counts)
        logprobs = packed_row_logprobs(
            trainer.model, plan, ids.to(device), positions, torch.ones(len(ids))
        ).cpu()
        (logprobs * weights[kept]).sum().backward()
        trained = ~in_prompt[kept]
        by_whole_index = dict(zip(kept[trained].tolist(), logprobs[trained], strict=True))
        gradients = {
            n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None
        }
        results.append((by_whole_index, gradients))
    (whole_logprobs, whole_grads), (shared_logprobs, shared_grads) = results
    assert len(shared[0]) == len(whole[0]) - 3 * 5 - 1 * 8  # the prompts shared
    assert shared_logprobs.keys() == whole_logprobs.keys()  # every completion token
    for token, value in whole_logprobs.items():
        torch.testing.assert_close(shared_logprobs[token], value, rtol=1e-5, atol=1e-5)
    assert shared_grads.keys() == whole_grads.keys()
    for name, grad in whole_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert any(g.abs().sum() > 0 for n, g in whole_grads.items() if "lora_A.1" in n)


def test_a_path_that_cannot_attend_to_shared_prompts_refuses_such_a_row():
    _, (ids, positions, _), _, _ = shared_prompt_rows()
    packed_sequences = PackedSequences.from_position_ids(positions, "cpu")
    assert packed_sequences.has_branches
    query = torch.zeros(1, 2, len(ids), 8)
    with pytest.raises(ValueError, match="share_prompts needs one of"):
        attention.packed_attention("varlen", query, query, query, packed_sequences, None)


@pytest.mark.parametrize("bias", [False, True])
def test_chunked_lm_head_equals_full_logits_in_values_and_gradients(bias):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 16, generator=generator, requires_grad=True)
    head = nn.Linear(16, 50, bias=bias)
    head.requires_grad_(True)
    input_ids = torch.randint(0, 50, (11,), generator=generator)
    # Three runs' tokens at three temperatures, as in a packed row.
    temperatures = torch.tensor([1.0] * 4 + [0.6] * 3 + [1.7] * 4)
    weights = torch.randn(11, generator=generator)

    full = compute_logprobs(head(hidden) / temperatures[:, None], input_ids)
    (full * weights).sum().backward()
    expected = [hidden.grad.clone(), head.weight.grad.clone()]
    if bias:
        expected.append(head.bias.grad.clone())
    hidden.grad = None
    head.zero_grad(set_to_none=True)

    chunked = chunked_token_logprobs(hidden, head, input_ids, temperatures, chunk_tokens=3)
    (chunked * weights).sum().backward()
    got = [hidden.grad, head.weight.grad] + ([head.bias.grad] if bias else [])
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-6)
    for ours, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


def test_chunked_lm_head_computes_only_the_needed_tokens_and_gives_them_the_full_gradients():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(40, 16, generator=generator, requires_grad=True)
    head = nn.Linear(16, 50)
    input_ids = torch.randint(0, 50, (40,), generator=generator)
    temperatures = torch.tensor([1.0] * 15 + [0.6] * 10 + [1.7] * 15)
    # Three samples' completions (the loss mask): 20 of 40 tokens.
    needed = torch.zeros(40, dtype=torch.bool)
    needed[5:12] = needed[18:25] = needed[34:40] = True
    weights = torch.randn(40, generator=generator)

    full = compute_logprobs(head(hidden) / temperatures[:, None], input_ids)
    (full * weights * needed).sum().backward()
    expected = [hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()]
    hidden.grad = None
    head.zero_grad(set_to_none=True)

    with counting_head_rows() as rows:
        chunked = chunked_token_logprobs(
            hidden, head, input_ids, temperatures, chunk_tokens=8, needed=needed
        )
    assert sum(rows) == 20, "the head ran on the needed tokens only"
    torch.testing.assert_close(chunked[needed], full[needed], rtol=1e-5, atol=1e-6)
    assert (chunked[~needed] == 0).all()
    (chunked * weights).sum().backward()
    got = [hidden.grad, head.weight.grad, head.bias.grad]
    for ours, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


def test_a_token_gets_the_same_log_prob_bits_whether_few_or_many_tokens_are_needed():
    # A row holding one short completion: the head still multiplies MIN_HEAD_ROWS rows,
    # since the CPU's products of a few rows round differently (on one thread, for this
    # width, those of 1 to 8 rows).
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(64, 256, generator=generator)
    head = nn.Linear(256, 300, bias=False)
    input_ids = torch.randint(0, 300, (64,), generator=generator)
    temperatures = torch.ones(64)
    many = torch.zeros(64, dtype=torch.bool)
    many[20:60] = True
    with counting_head_rows() as rows, torch.no_grad(), torch_threads(1):
        among_many = chunked_token_logprobs(hidden, head, input_ids, temperatures, needed=many)
        for token in range(20, 60):
            alone = torch.zeros(64, dtype=torch.bool)
            alone[token] = True
            got = chunked_token_logprobs(hidden, head, input_ids, temperatures, needed=alone)
            assert torch.equal(got[token], among_many[token]), f"token {token}"
    assert rows == [40] + [lm_head.MIN_HEAD_ROWS] * 40


@contextlib.contextmanager
def counting_head_rows():
    """The rows of each LM head product in the block."""
    rows: list[int] = []
    real_linear = F.linear

    def counting_linear(x, *args):
        rows.append(x.shape[0])
        return real_linear(x, *args)

    with unittest.mock.patch.object(lm_head.F, "linear", counting_linear):
        yield rows


def row_loss(trainer, samples, counts, plan) -> torch.Tensor:
    """The samples packed in one row, routed by `counts`: their log-probs, weighted -1 to 1."""
    device = next(trainer.model.parameters()).device
    input_ids, positions = packed(samples)
    set_lora_num_tokens(trainer.model, counts)
    logprobs = packed_row_logprobs(
        trainer.model, plan, input_ids.to(device), positions, torch.ones(len(input_ids))
    )
    weights = torch.linspace(-1, 1, len(input_ids), device=device)
    return (logprobs.float() * weights).sum()


def lora_gradients(trainer, samples, counts, plan) -> dict[str, torch.Tensor]:
    row_loss(trainer, samples, counts, plan).backward()
    return {
        name: param.grad.clone()
        for name, param in trainer.model.named_parameters()
        if param.requires_grad and param.grad is not None
    }


@pytest.mark.parametrize("path", ["auto", "per_run_loop", "plain"])
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_activation_checkpointing_on_or_off_gives_the_reference_adapter_gradients_for_several_runs(
    tmp_path, device, dtype, path
):
    # The reference: the plain per-run LoRA, every activation kept. "auto" is the grouped
    # op on the CPU and with bf16 on Hopper, the per-run loop elsewhere on CUDA.
    runs = {"run_a": "seed = 1\n", "run_b": "seed = 2\n", "run_c": "seed = 3\n"}
    samples = random_samples([6, 4, 8, 5, 7])
    counts = torch.tensor([10, 8, 12])  # run_a: 6 + 4, run_b: 8, run_c: 5 + 7
    section = TrainerSection(attention="per_sample", activation_checkpointing=False)
    gradients = {}
    for name, lora_path, checkpointing in [
        ("reference", "plain", False),
        ("kept", path, False),
        ("recomputed", path, True),
    ]:
        trainer = build_trainer(tmp_path / name, runs, path=lora_path, device=device, dtype=dtype)
        plan = prepare_model(trainer.model, section, torch.device(device))
        if checkpointing:
            apply_activation_checkpointing(trainer.model)
        gradients[name] = lora_gradients(trainer, samples, counts, plan)
    reference = gradients["reference"]
    for slot in range(3):  # B starts at zero, so B's gradient is where every run learns
        assert any(g.abs().sum() > 0 for n, g in reference.items() if f"lora_B.{slot}" in n)
    # bf16 products round differently from one summation order to another.
    rtol = 1e-5 if dtype == torch.float32 else 3e-2
    for name in ("kept", "recomputed"):
        assert gradients[name].keys() == reference.keys()
        for param, grad in reference.items():
            scale = grad.abs().max().item()
            torch.testing.assert_close(
                gradients[name][param], grad, rtol=rtol, atol=rtol * scale, msg=f"{name} {param}"
            )


@pytest.mark.parametrize("device", DEVICES)
def test_a_backward_in_another_thread_recomputes_each_layer_with_its_forwards_routing(
    tmp_path, device
):
    # On CUDA autograd runs the backward (and so every recomputation) in a device thread of
    # its own, whose routing the training loop never set. On the CPU a backward runs in the
    # thread that calls it: a forward in one thread and its backward in another is that.
    runs = {"run_a": "seed = 1\n", "run_b": "seed = 2\n"}
    samples = random_samples([6, 9, 5])
    counts = torch.tensor([15, 5])
    section = TrainerSection(attention="per_sample", activation_checkpointing=False)
    kept = build_trainer(tmp_path / "kept", runs, device=device)
    expected = lora_gradients(kept, samples, counts, prepare_model(kept.model, section, device))

    trainer = build_trainer(tmp_path / "recomputed", runs, device=device)
    section = TrainerSection(attention="per_sample", activation_checkpointing=True)
    plan = prepare_model(trainer.model, section, device)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        loss = pool.submit(row_loss, trainer, samples, counts, plan).result()
    loss.backward()  # this thread never routed a token
    for name, param in trainer.model.named_parameters():
        if name in expected:
            torch.testing.assert_close(param.grad, expected[name], rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for n, g in expected.items() if "lora_B.1" in n)


def _dense_with_a_graph_break(query, key, value, packed, scaling):
    # A stand-in for a kernel dynamo cannot trace (torch's varlen on an H100, torch 2.11):
    # the dense path with a graph break in front of it.
    torch._dynamo.graph_break()
    return attention._dense(query, key, value, packed, scaling)


COMPILED_PATHS = [
    *[pytest.param(device, path, id=f"{device}-{path}") for device, path in device_paths()],
    pytest.param("cpu", "dense_with_a_graph_break", id="cpu-dense-with-a-graph-break"),
]


@pytest.mark.parametrize(("device", "path"), COMPILED_PATHS)
def test_compiled_checkpointed_layers_route_their_recomputation_as_their_forward(
    tmp_path, monkeypatch, device, path
):
    # Compiled around its checkpoint, a layer whose graph broke ran the checkpoint eagerly,
    # without the routing its recomputation needs in autograd's device thread: every
    # compiled, checkpointed update with varlen attention on an H100 failed in backward
    # with "no token counts set". On CUDA the recomputation runs in that device thread as
    # in training; on the CPU the backward runs in a thread that never routed a token.
    if path == "dense_with_a_graph_break":
        monkeypatch.setitem(attention._KERNELS, "dense", _dense_with_a_graph_break)
        path = "dense"
    runs = {"run_a": "seed = 1\n", "run_b": "seed = 2\n"}
    dtype = widest_dtype(device, path)
    samples = random_samples([6, 9, 5])
    counts = torch.tensor([15, 5])
    eager = TrainerSection(attention=path, activation_checkpointing=False)
    built = {"device": device, "dtype": dtype, "head_dim": HEAD_DIM[device]}
    kept = build_trainer(tmp_path / "kept", runs, **built)
    expected = lora_gradients(kept, samples, counts, prepare_model(kept.model, eager, device))

    trainer = build_trainer(tmp_path / "compiled", runs, **built)
    section = TrainerSection(attention=path, activation_checkpointing=True, compile=True)
    plan = prepare_model(trainer.model, section, device)
    torch._dynamo.reset()
    if device == "cuda":
        loss = row_loss(trainer, samples, counts, plan)
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            loss = pool.submit(row_loss, trainer, samples, counts, plan).result()
    loss.backward()
    for name, param in trainer.model.named_parameters():
        if name not in expected:
            continue
        if dtype == torch.float32:
            torch.testing.assert_close(param.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)
        else:  # bfloat16: compare the gradient as a whole
            error = (param.grad - expected[name]).norm() / expected[name].norm().clamp_min(1e-12)
            assert error < 5e-2, f"{name}: relative error {error:.3g}"
    assert any(g.abs().sum() > 0 for n, g in expected.items() if "lora_B.1" in n)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["kept", "recomputed"])
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_a_decoder_layer_with_multi_lora_compiles_into_one_graph(
    tmp_path, device, dtype, checkpointing
):
    runs = {"run_a": "seed = 1\n", "run_b": "seed = 2\n"}
    trainer = build_trainer(tmp_path / "exp", runs, device=device, dtype=dtype)
    # "dense", a path traced whole: "per_sample" runs eagerly inside a compiled layer
    # (attention.EAGER_UNDER_COMPILE), a graph break by design.
    section = TrainerSection(attention="dense", activation_checkpointing=checkpointing)
    prepare_model(trainer.model, section, torch.device(device))
    input_ids, positions = (t[None].to(device) for t in packed(random_samples([12, 8])))
    packed_sequences = PackedSequences.from_position_ids(positions, device)
    # Built before the first layer, as `packed_row_logprobs` does.
    packed_sequences.build_for("dense")
    set_lora_num_tokens(trainer.model, [12, 8])
    hidden = trainer.model.get_input_embeddings()(input_ids)
    position_embeddings = trainer.model.model.rotary_emb(hidden, positions)

    explanation = torch._dynamo.explain(decoder_layers(trainer.model)[0])(
        hidden,
        attention_mask=None,
        position_ids=positions,
        position_embeddings=position_embeddings,
        packed_sequences=packed_sequences,
    )
    assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]
    assert explanation.graph_count == 1


@pytest.mark.parametrize("attention_path", ["per_sample", "dense"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["kept", "recomputed"])
def test_compiled_decoder_layers_stop_compiling_once_warm_whatever_the_rows(
    tmp_path, checkpointing, attention_path
):
    # A compiled layer that specialised on its row (the row's length, its samples' lengths,
    # whether its input required grad) compiled again for nearly every row, until dynamo's
    # recompile limit ran the layers eagerly for good.
    runs = {"run_a": "seed = 1\n", "run_b": "seed = 2\n"}
    trainer = build_trainer(tmp_path, runs)
    section = TrainerSection(
        attention=attention_path, compile=True, activation_checkpointing=checkpointing
    )
    plan = prepare_model(trainer.model, section, "cpu")
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    lora_gradients(trainer, random_samples([6, 9, 5]), torch.tensor([15, 5]), plan)
    warm = (counters["frames"]["total"], counters["stats"]["unique_graphs"])
    assert warm[0] > 0  # the layers did compile
    rows = [([3, 11, 2, 7], [16, 7]), ([17], [17, 0]), ([4, 4, 4, 4, 4, 4, 2], [12, 14])]
    for seed, (lengths, counts) in enumerate(rows, start=1):
        samples = random_samples(lengths, seed=seed)
        lora_gradients(trainer, samples, torch.tensor(counts), plan)
    assert (counters["frames"]["total"], counters["stats"]["unique_graphs"]) == warm
    assert counters["frames"]["total"] == counters["frames"]["ok"]


def test_compiled_decoder_layers_give_the_same_logprobs_and_gradients_as_eager(tmp_path):
    # Compilation is optional and never needed for correctness; this is the check that it
    # changes nothing but speed (about half a minute of compiling on two CPU cores).
    runs = {"run_a": "seed = 1\n", "run_b": "seed = 2\n"}
    results = []
    for compile_layers in (False, True):
        trainer = build_trainer(tmp_path / str(compile_layers), runs)
        plan = prepare_model(trainer.model, TrainerSection(compile=compile_layers), "cpu")
        assert plan.compiled is compile_layers
        samples = random_samples([6, 9, 5])
        gradients = lora_gradients(trainer, samples, torch.tensor([15, 5]), plan)
        results.append(gradients)
    eager, compiled = results
    assert eager.keys() == compiled.keys()
    for name, grad in eager.items():
        torch.testing.assert_close(compiled[name], grad, rtol=1e-4, atol=1e-6, msg=name)
