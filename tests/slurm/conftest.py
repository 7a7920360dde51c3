"""The one-host Slurm cluster the Slurm tests submit to: Debian's slurm-wlm and munge,
slurmctld and slurmd on this machine (`scripts/slurm_one_host.sh`, which CI's `.ci/run`
runs, through `scripts/test_system.sh`, the README's test command). Where Slurm is not
installed the tests that need it fail, saying how to get it (a skip would pass the suite
without them); where it is installed but down, the fixture starts it (as root) or fails."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "slurm_one_host.sh"


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """This machine's host name, once its one-host cluster answers `sinfo`."""
    if shutil.which("sbatch") is None:
        pytest.fail(
            "Slurm is not installed here: run `sudo bash scripts/test_system.sh` (tmux, "
            "chromium and a one-host Slurm cluster; the README's test command does)"
        )
    if subprocess.run(["bash", str(SETUP), "--check"]).returncode != 0:
        if os.geteuid() != 0:
            pytest.fail(
                "the one-host Slurm cluster is down: run `sudo bash scripts/slurm_one_host.sh`"
            )
        started = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True)
        assert started.returncode == 0, started.stdout + started.stderr
    return socket.gethostname().split(".")[0]
