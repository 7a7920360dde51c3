"""workbench's vLLM plugin, loaded by vLLM in each process it starts (the API server, the
engine core, the workers) from the `vllm.general_plugins` entry point.

It acts only in a server workbench started: `workbench.inference.server` sets
`WORKBENCH_VLLM_SERVER=1` in its environment, and any other vLLM in the same environment is
left as it is. On a CPU it
- rewinds a seeded request's generator the CPU's way when its prefill is split across engine
  steps (`workbench.inference.seeded_sampling`; vLLM's own rewind crashes on the CPU);
- with `WORKBENCH_VLLM_CPU_LORA=slot-matmul` (the default) makes vLLM's multi-LoRA layers use
  `workbench.inference.cpu_lora` instead of vLLM's per-token products; `vllm` keeps vLLM's own;
- counts the ranks of sampled tokens without compiling a kernel at the first sampling
  (`workbench.inference.eager_ranks`);
- decodes no token of a request's log-probs when the request asks for them as ids only
  (`workbench.inference.token_id_logprobs`; the orchestrator's requests do);
- with `WORKBENCH_VLLM_FORK_ENGINE=1` (small machines) forks the engine core from the API
  server instead of spawning it (`workbench.inference.engine_fork`).
These patch vLLM internals, so it refuses an engine of a release it was not tested against
(`workbench.inference.engine_version`).
"""

from __future__ import annotations

import os

SERVER_ENV = "WORKBENCH_VLLM_SERVER"
CPU_LORA_ENV = "WORKBENCH_VLLM_CPU_LORA"
SLOT_MATMUL = "slot-matmul"
CPU_LORA_KERNELS = (SLOT_MATMUL, "vllm")
DEFAULT_CPU_LORA_KERNEL = SLOT_MATMUL
SLOT_MATMUL_WRAPPER = "workbench.inference.cpu_lora.SlotMatmulPunicaWrapperCPU"


class UntestedEngineError(RuntimeError):
    """The installed vLLM is not the release the plugin's patches were written for."""


def register() -> None:
    if os.environ.get(SERVER_ENV) != "1":
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from workbench.inference.engine_version import engine_version_problem

    problem = engine_version_problem()
    if problem is not None:
        raise UntestedEngineError(problem)
    from workbench.inference import eager_ranks, engine_fork, seeded_sampling, token_id_logprobs

    seeded_sampling.install_on_cpu_runner()
    eager_ranks.install()
    token_id_logprobs.install()
    if os.environ.get(engine_fork.FORK_ENGINE_ENV) == "1":
        engine_fork.install(type(current_platform))
    if os.environ.get(CPU_LORA_ENV) == SLOT_MATMUL:
        # vLLM asks its platform which class wraps the LoRA kernels
        # (`vllm.lora.punica_wrapper.punica_selector`); the CPU platform names its own.
        type(current_platform).get_punica_wrapper = classmethod(lambda cls: SLOT_MATMUL_WRAPPER)
