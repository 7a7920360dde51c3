#!/usr/bin/env bash
# The system packages the test suite drives, installed and started: tmux (the TUI's
# real-terminal test), Debian's headless chromium (the browser tests of `workbench web`;
# playwright downloads no browser of its own) and a one-host Slurm cluster (tests/slurm submit
# real jobs; scripts/slurm_one_host.sh). Safe to run again: what is there is left alone.
#
# The README's test command runs it before pytest, and .ci/run runs the README's test
# command: a package that fails to install fails the run here, with its name, instead of
# letting its tests fail (or skip) one by one later.
#
#   bash scripts/test_system.sh          # install what is missing (as root, or through sudo)
#   bash scripts/test_system.sh --check  # exit 0 when everything is there, 1 (naming it) if not
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "test_system.sh: '$*' needs root and there is no sudo; run this script as root" >&2
        exit 1
    fi
}

missing_packages() {
    command -v tmux >/dev/null 2>&1 || echo tmux
    command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
        echo chromium
}

if [ "${1:-}" = "--check" ]; then
    missing=$(missing_packages | xargs)
    bash scripts/slurm_one_host.sh --check || missing="$missing slurm(one-host cluster)"
    if [ -n "${missing// /}" ]; then
        echo "test_system.sh: missing: $missing" >&2
        exit 1
    fi
    exit 0
fi

mapfile -t packages < <(missing_packages)
if [ ${#packages[@]} -gt 0 ]; then
    echo "test_system.sh: installing ${packages[*]}"
    if ! as_root env DEBIAN_FRONTEND=noninteractive sh -c \
        "apt-get update -qq && apt-get install -y -qq --no-install-recommends ${packages[*]} >/dev/null"; then
        echo "test_system.sh: could not install ${packages[*]} (apt-get failed above)" >&2
        exit 1
    fi
fi
mapfile -t still < <(missing_packages)
if [ ${#still[@]} -gt 0 ]; then
    echo "test_system.sh: ${still[*]} installed but not on PATH" >&2
    exit 1
fi
as_root bash scripts/slurm_one_host.sh
