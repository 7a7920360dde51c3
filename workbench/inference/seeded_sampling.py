"""Seeded sampling on vLLM's CPU build when a prefill is split across engine steps.

vLLM's scheduler splits a long prompt's prefill over several engine steps (chunked prefill)
when one step's token budget cannot hold it. Each step still samples a token for that
request, which is then thrown away; to keep a seeded request's tokens the same whether or
not its prefill was split, vLLM's model runner then rewinds the request's generator
(`_bookkeeping_sync`: `gen.set_offset(gen.get_offset() - 4)`). That is a CUDA Philox
generator's offset; torch's CPU generator (Mersenne Twister) has none, and the engine
dies with `RuntimeError: CPU Generator does not use offset` at the first split prefill of
a seeded request. workbench seeds every request, so on the CPU any prompt long enough to
be split (128 completions of a 105-token prompt, any real dataset) killed inference.

The rewind here does what vLLM's means, on the CPU generator's terms: before sampling,
the state of every generator whose token will be thrown away is saved (5 KB each, only
for the requests of a split prefill), and after sampling it is restored, so the draw
never happened. vLLM's own rewind is skipped for those generators. A seeded request then
gives the same tokens split or not, as on a GPU.

The other way out, never splitting a prefill on the CPU (`--no-enable-chunked-prefill`),
was measured against this one: see `docs/` (measurements) and `bench inference`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

PATCHED_FLAG = "_workbench_seeded_prefill_rewind"


def discarded_generators(runner: Any) -> dict[int, torch.Generator]:
    """The per-request generators of this step whose sampled token will be discarded: the
    requests whose prefill is not finished yet (vLLM's `discard_request_mask`)."""
    num_reqs = runner.input_batch.num_reqs
    indices = np.nonzero(runner.discard_request_mask.np[:num_reqs])[0]
    generators = runner.input_batch.generators
    return {int(i): generators[int(i)] for i in indices if int(i) in generators}


def install(runner_class: type) -> None:
    """Patch `runner_class` (vLLM's CPU model runner) once: save the state of each generator
    whose draw will be discarded before sampling, restore it in the bookkeeping that
    follows, where vLLM would rewind a CUDA offset."""
    if getattr(runner_class, PATCHED_FLAG, False):
        return
    original_sample: Callable[..., Any] = runner_class._sample
    original_bookkeeping: Callable[..., Any] = runner_class._bookkeeping_sync

    def _sample(self, *args: Any, **kwargs: Any) -> Any:
        self._workbench_saved_generator_states = {
            index: generator.get_state() for index, generator in discarded_generators(self).items()
        }
        return original_sample(self, *args, **kwargs)

    def _bookkeeping_sync(self, *args: Any, **kwargs: Any) -> Any:
        saved: dict[int, torch.Tensor] = getattr(self, "_workbench_saved_generator_states", {})
        self._workbench_saved_generator_states = {}
        generators = self.input_batch.generators
        # Out of vLLM's sight while it rewinds: its rewind is the CUDA offset's.
        held = {index: generators.pop(index) for index in saved if index in generators}
        try:
            return original_bookkeeping(self, *args, **kwargs)
        finally:
            for index, generator in held.items():
                generator.set_state(saved[index])
                generators[index] = generator

    runner_class._sample = _sample
    runner_class._bookkeeping_sync = _bookkeeping_sync
    setattr(runner_class, PATCHED_FLAG, True)


def install_on_cpu_runner() -> None:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    install(CPUModelRunner)
