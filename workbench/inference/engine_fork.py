"""On a small CPU machine, vLLM's engine core is forked from its API server, not spawned.

vLLM's CPU platform sets `VLLM_WORKER_MULTIPROC_METHOD=spawn` for every process vLLM starts
(in its config check), so the engine core begins as a new interpreter and imports vLLM,
torch and transformers again, as the API server has just done. On the 2-core machine a
server took 18.6-24.9 s to answer its health check, and 11.3-13.5 s with the engine core
forked (three starts each, alternating, 2026-12-06): every `workbench up` and every restart
of inference waits for that.

The spawn is there for vLLM's CPU workers, which bind OpenMP threads to cores, and an
OpenMP thread pool does not survive a fork. Where workbench runs vLLM on a small machine
the engine core computes itself, on one thread (`OMP_NUM_THREADS=1`, no worker processes:
`workbench.inference.server`), and the API server runs no parallel region before it starts
the engine: forking it there is what vLLM does on a GPU. The server's environment asks for
this (`FORK_ENGINE_ENV`) on small machines only; elsewhere vLLM spawns as it chooses.
"""

from __future__ import annotations

import os

FORK_ENGINE_ENV = "WORKBENCH_VLLM_FORK_ENGINE"
MULTIPROC_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"


def install(platform_class: type) -> None:
    """After `platform_class`'s config check, start vLLM's processes by forking again."""
    vllms = platform_class.check_and_update_config.__func__
    if getattr(vllms, "forks_engine", False):
        return

    def check_and_update_config(cls, vllm_config):
        vllms(cls, vllm_config)
        os.environ[MULTIPROC_METHOD_ENV] = "fork"

    check_and_update_config.forks_engine = True
    platform_class.check_and_update_config = classmethod(check_and_update_config)
