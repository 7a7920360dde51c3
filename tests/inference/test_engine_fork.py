"""On a small machine vLLM's engine core is forked from its API server, not spawned."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")

from workbench.inference import server
from workbench.inference.engine_fork import FORK_ENGINE_ENV
from workbench.models.resolve import resolve_model

# vLLM's own config check, on the CPU platform, for the built-in model; prints the start
# method vLLM's launcher then reads.
CONFIG_CHECK = """
import os, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform
from workbench.inference import engine_fork
if sys.argv[2] == "patched":
    engine_fork.install(type(current_platform))
    engine_fork.install(type(current_platform))  # a second install changes nothing
EngineArgs(model=sys.argv[1], dtype="float32", enable_lora=True).create_engine_config()
print(os.environ["VLLM_WORKER_MULTIPROC_METHOD"])
"""


def _start_method(patched: bool) -> str:
    model = str(resolve_model("builtin:tiny-reverse"))
    done = subprocess.run(
        [sys.executable, "-c", CONFIG_CHECK, model, "patched" if patched else "as-is"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_vllms_cpu_platform_spawns_and_the_patch_forks_again():
    # If vLLM stops asking for spawn on the CPU, the patch is no longer needed: this fails
    # to say so.
    assert _start_method(patched=False) == "spawn"
    assert _start_method(patched=True) == "fork"


def test_the_server_asks_for_the_fork_only_with_one_thread_and_no_workers():
    assert server.server_environment("key", base={}, usable_cpus=2)[FORK_ENGINE_ENV] == "1"
    assert FORK_ENGINE_ENV not in server.server_environment("key", base={}, usable_cpus=16)
    # threads or worker processes the user asked for: vLLM starts its processes its way
    for mine in ({"OMP_NUM_THREADS": "2"}, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}):
        assert FORK_ENGINE_ENV not in server.server_environment("key", base=mine, usable_cpus=2)
    # and a value the user set wins
    mine = {FORK_ENGINE_ENV: "0"}
    assert server.server_environment("key", base=mine, usable_cpus=2)[FORK_ENGINE_ENV] == "0"
