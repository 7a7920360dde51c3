"""On the CPU, the rank of each sampled token is counted without compiling a kernel first.

vLLM's sampler ranks every token whose logprob it returns (workbench asks for the sampled
token's logprob in every request) with `batched_count_greater_than`, a one-line function
under `torch.compile`, "to generate an optimized kernel ... otherwise, it will create
additional copies of the input tensors" (vLLM's docstring: on a GPU, a vocabulary-wide
boolean tensor per token). On the CPU that compile happens at the first sampling of every
server: Inductor hashes the torch and Triton sources for its cache key and builds a C++
kernel, some 9 s of the engine's one thread in a 32-run experiment on the 2-core machine
(py-spy over the engine, 2026-11-28: 446 of 8,393 samples in Dynamo's frame conversion,
218 of them in `triton_key`), while every run waits for its first rollouts.

Counted eagerly, the comparison makes one boolean tensor of the logprobs' shape (tokens x
vocabulary; 128 x 151,936 is 19 MB for a Qwen3 model), which the CPU's memory takes in its
stride, and the counts are the same integers. `install()` swaps the function vLLM's sampler
module calls; it runs only on the CPU platform (`workbench.inference.vllm_plugin`).
"""

from __future__ import annotations

import torch


def count_greater_or_equal(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """For each row of x, how many of its elements are >= that row's value: vLLM's
    `batched_count_greater_than` (despite its name, >=), eagerly."""
    return (x >= values).sum(-1)


def install() -> None:
    from vllm.v1.sample import sampler

    sampler.batched_count_greater_than = count_greater_or_equal
