"""`workbench bench trainer`'s measuring, not its figures: real worker processes on the
tiny model with every size turned down."""

from __future__ import annotations

import math

import torch

from workbench.bench.trainer import (
    WorkerSpec,
    measure,
    peak_memory,
    reset_peak_memory,
    run_side_by_side,
)


def tiny_spec(**overrides) -> WorkerSpec:
    settings = {"mode": "shared", "shape": "tiny", "runs": 1, "tokens": 256, "seq_len": 256}
    settings |= {"sample_len": 64, "rank": 8, "steps": 2}
    return WorkerSpec(**(settings | overrides))


def test_separate_trainers_time_their_steps_side_by_side():
    results = run_side_by_side(tiny_spec(), 2)
    assert len(results) == 2
    for step in range(2):
        spans = [result["step_spans"][step] for result in results]
        latest_start = max(start for start, _ in spans)
        earliest_end = min(end for _, end in spans)
        assert latest_start < earliest_end, f"step {step}: {spans} do not overlap"
    assert all(result["lora"] == "grouped matmul" for result in results)


def test_a_configuration_that_runs_out_of_memory_is_a_row_saying_oom():
    # One row of 2^19 tokens through the dense T x T mask: 256 GiB, more than any CPU here.
    spec = tiny_spec(tokens=2**19, seq_len=2**19, sample_len=2**19, steps=1)
    spec.compute = {"attention": "dense"}
    row = measure(spec, "shared")
    assert row.note.startswith("OOM: ")
    assert math.isnan(row.tokens_per_s)


def test_resetting_the_peak_memory_forgets_a_spike_before_it():
    # What keeps the warm-up update out of the measured peaks (CPU: the kernel's VmHWM).
    device = torch.device("cpu")
    reset_peak_memory(device)
    start = peak_memory(device)["peak_rss_mb"]
    spike = torch.ones(128 * 2**20, dtype=torch.uint8)  # 128 MiB, touched, then freed
    del spike
    assert peak_memory(device)["peak_rss_mb"] >= start + 100
    reset_peak_memory(device)
    assert peak_memory(device)["peak_rss_mb"] < start + 64


def test_two_ranks_measure_the_base_each_rank_holds_replicated_and_sharded():
    # Under torchrun: the global batch's tokens, and the largest rank's share of the base.
    spec = tiny_spec(runs=2, tokens=512, ranks=2, steps=1)
    replicated, sharded = measure(spec, "replicated"), measure(spec, "sharded")
    assert not replicated.note and not sharded.note
    assert replicated.tokens == sharded.tokens == 512
    assert (replicated.ranks, sharded.ranks) == (2, 2)
    assert "base sharded" in sharded.compute and "base replicated" in replicated.compute
    assert sharded.base_mb <= 0.55 * replicated.base_mb


def test_mixed_losses_are_measured_beside_uniform_ones_with_their_ratio():
    from workbench.bench.trainer import BenchSettings, run_benchmark

    settings = BenchSettings(
        models=["tiny"], run_counts=[2], steps=1, tokens=256, seq_len=256, sample_len=64,
        losses=["ppo", "gspo"], pairs=1,
    )  # fmt: skip
    uniform, mixed = run_benchmark(settings)
    assert (uniform.mode, uniform.losses) == ("uniform", "ppo")
    assert (mixed.mode, mixed.losses) == ("mixed", "ppo,gspo")
    assert mixed.vs_uniform == mixed.tokens_per_s / uniform.tokens_per_s


def test_publishing_writes_what_vllm_loads_and_counts_its_bytes(tmp_path):
    from workbench.bench.publishing import (
        copy_out,
        load_as_vllm,
        measure_publishing,
        synthetic_adapter,
    )
    from workbench.bench.trainer import model_config
    from workbench.config import LORA_TARGET_MODULES
    from workbench.files import layout
    from workbench.models.resolve import model_shapes
    from workbench.trainer.runs.publisher import AdapterPublisher

    config, targets = model_config("tiny"), list(LORA_TARGET_MODULES)
    copy_out(tmp_path, 1, 0, synthetic_adapter(config, 8, targets, 0),
             publisher=AdapterPublisher(), rank=8, targets=targets, shape="tiny").write()  # fmt: skip
    loaded = load_as_vllm(layout.broadcast_dir(tmp_path, 1), targets, config, "tiny")
    assert len(loaded.loras) == config.num_hidden_layers * len(targets)  # every projection

    row = measure_publishing("tiny", 2, None, 1)
    parameters = model_shapes("builtin:tiny-reverse").adapter_parameters(8, targets)
    assert row.adapter_parameters == parameters
    # float32 weights plus the adapter's config files, a few KiB
    assert 4 * parameters < row.adapter_bytes < 4 * parameters + 64 * 1024
    assert row.copy_s > 0 and row.write_s > 0 and row.write_one_by_one_s > 0 and row.load_s > 0
