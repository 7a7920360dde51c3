#!/usr/bin/env bash
# The trainer's CUDA checks, in one call on a GPU machine, from the project's root; results
# under $OUT (default /tmp/gpu-out). Carry the wheels the machine lacks in .gpu/. Sized
# for about eight minutes: every CUDA test of the trainer
# (`-k cuda`: the device-parametrised ones), then the anchor's shape with 1 and 4 runs
# against peft, 8 runs, 4 runs with flex attention, 4 runs with each layer compiled, and
# 16, 32 and 64 runs.
# Each measurement is its own command with its own time limit and JSON, so one that hangs
# leaves the others their time and their results.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
if compgen -G ".gpu/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu/*.whl || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"; } 2>&1 | tee "$OUT/gpu.txt"

step() {  # step NAME SECONDS COMMAND...: run it, its output in $OUT/NAME.txt, then a summary
  local name=$1 limit=$2 started; shift 2
  started=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name: exit $? after $(( $(date +%s) - started )) s"
}

step pytest-cuda 120 python3 -m pytest -q -p no:cacheprovider -rfE -k cuda tests/trainer
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-cuda.txt" | cut -c1-250

bench=(python3 -c "from workbench.cli import app; app()" bench trainer --models qwen3-0.6b --tokens 16384 --seq-len 16384
  --sample-len 512 --rank 16 --no-legacy --no-separate)
measure() {  # measure NAME SECONDS OPTIONS...: one bench trainer command, its JSON kept
  local name=$1 limit=$2; shift 2
  rm -f benchmarks/results/trainer-latest.json
  step "bench-$name" "$limit" "${bench[@]}" "$@"
  cp benchmarks/results/trainer-latest.json "$OUT/bench-$name.json" 2>/dev/null
}
measure varlen 100 --runs 1,4
measure varlen-8 60 --runs 8 --no-peft
measure flex 60 --runs 4 --no-peft --attention flex
measure compile 90 --runs 4 --no-peft --compile
# Issue 44's sweep: tokens per update fixed, what grows with the runs (targets: 8 runs
# >= 0.95x and 64 runs >= 0.85x one run's tokens/s).
measure runs-16-64 120 --runs 16,32,64 --no-peft
grep -hE "^  (peft|shared)" "$OUT"/bench-*.txt
