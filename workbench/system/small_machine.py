"""A machine of at most two usable CPUs, where every process computes on one thread.

On such a machine vLLM (its CPU build) and the trainer take turns on the same cores. Measured
on 2 cores, 4 runs x 20 steps of reverse_text, alternating:
- vLLM's worker in a process of its own, pinned to core 0, against the model run inside
  vLLM's engine-core process on one unpinned thread: 87 s against 70-73 s (see
  `workbench.inference.server.server_environment`);
- then the trainer on torch's default two threads against one: 72 and 74 s against 68 and
  63 s (two threads wait on each other whenever vLLM holds a core).
Both settings give way to the user's own (`VLLM_ENABLE_V1_MULTIPROCESSING`,
`OMP_NUM_THREADS`). On more cores each keeps its usual threads. A third follows from the
same rule: vLLM yields the CPU to the trainer (`workbench.system.priority.inference_nice`).
"""

from __future__ import annotations

import os

SMALL_MACHINE_CPUS = 2


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0))


def is_small_machine(cpus: int | None = None) -> bool:
    return (usable_cpus() if cpus is None else cpus) <= SMALL_MACHINE_CPUS
