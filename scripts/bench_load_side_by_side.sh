#!/usr/bin/env bash
# `workbench bench load --quick` on two source trees, alternately, N pairs, so that the
# machine's drift hits both alike. Each run takes the shared heavy lock (vLLM's CPU build
# refuses to start beside another); each tree writes its results under its own
# benchmarks/results/.
#
#   scripts/bench_load_side_by_side.sh BEFORE_TREE AFTER_TREE [PAIRS] [EXTRA_PYTHONPATH]
#
# BEFORE_TREE, e.g. a `git worktree add --detach /tmp/before COMMIT`; EXTRA_PYTHONPATH for
# what the before tree needs and this venv no longer has (a `pip install --target` folder).
set -euo pipefail
before=$(realpath "$1") after=$(realpath "$2") pairs=${3:-3} extra=${4:-}
venv=$(realpath "$(dirname "$0")/../.venv")
for i in $(seq 1 "$pairs"); do
    for tree in "$before" "$after"; do
        path=$tree
        [ "$tree" = "$before" ] && [ -n "$extra" ] && path=$tree:$extra
        echo "=== pair $i: $tree $(date +%T)"
        (cd "$tree" && flock /tmp/workbench-heavy.lock env PYTHONPATH="$path" \
            "$venv/bin/workbench" bench load --quick 2>&1 | tail -2)
    done
done
