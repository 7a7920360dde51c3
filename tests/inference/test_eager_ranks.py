"""The sampled tokens' ranks on the CPU: counted eagerly, as vLLM's compiled function counts."""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")

from vllm.v1.sample.ops.logprobs import batched_count_greater_than  # noqa: E402

from workbench.inference.eager_ranks import count_greater_or_equal  # noqa: E402


def test_the_counts_are_vllms_ranks_ties_included():
    # vLLM's function body, run without compiling it: what its kernel computes.
    vllms = batched_count_greater_than._torchdynamo_orig_callable
    generator = torch.Generator().manual_seed(0)
    # Logprobs rounded to a coarse grid, so that tokens tie with the sampled one.
    logprobs = (torch.randn(37, 500, generator=generator) * 4).round() / 4
    sampled = torch.randint(0, 500, (37, 1), generator=generator)
    values = logprobs.gather(-1, sampled)
    assert torch.equal(count_greater_or_equal(logprobs, values), vllms(logprobs, values))
    # The most likely token is rank 1; one tied with two others counts all three.
    rows = torch.tensor([[0.0, -1.0, -2.0], [-1.0, -1.0, -1.0]])
    assert count_greater_or_equal(rows, torch.tensor([[0.0], [-1.0]])).tolist() == [1, 3]
