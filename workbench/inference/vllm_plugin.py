"""workbench's vLLM plugin, loaded by vLLM in each process it starts (the API server, the
engine core, the workers) from the `vllm.general_plugins` entry point.

It acts only in a server workbench started: `workbench.inference.server` sets
`WORKBENCH_VLLM_CPU_LORA` in its environment, and any other vLLM in the same environment is
left as it is. On a CPU, `slot-matmul` (the default) makes vLLM's multi-LoRA layers use
`workbench.inference.cpu_lora` instead of vLLM's per-token products; `vllm` keeps vLLM's own.
"""

from __future__ import annotations

import os

CPU_LORA_ENV = "WORKBENCH_VLLM_CPU_LORA"
SLOT_MATMUL = "slot-matmul"
CPU_LORA_KERNELS = (SLOT_MATMUL, "vllm")
DEFAULT_CPU_LORA_KERNEL = SLOT_MATMUL
SLOT_MATMUL_WRAPPER = "workbench.inference.cpu_lora.SlotMatmulPunicaWrapperCPU"


def register() -> None:
    if os.environ.get(CPU_LORA_ENV) != SLOT_MATMUL:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    # vLLM asks its platform which class wraps the LoRA kernels
    # (`vllm.lora.punica_wrapper.punica_selector`); the CPU platform names its own.
    type(current_platform).get_punica_wrapper = classmethod(lambda cls: SLOT_MATMUL_WRAPPER)
