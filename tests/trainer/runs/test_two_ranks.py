"""MultiRunManager across two real torchrun ranks (gloo, CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from workbench.system.ports import free_port

WORKER = Path(__file__).with_name("two_rank_worker.py")


def test_rank_one_follows_the_master_mappings_progress_configs_and_hooks(tmp_path: Path):
    experiment = tmp_path / "exp"
    experiment.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            str(WORKER),
            str(experiment),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())

    assert rank1["phases"] == rank0["phases"]
    first, second, third = rank0["phases"]
    assert first["idx_2_id"] == {"0": "run_a", "1": "run_b"}
    assert first["lr"] == {"0": 0.001, "1": 0.002}
    assert second["idx_2_id"] == {"0": "run_c", "1": "run_b"}
    assert second["lr"] == {"0": 0.003, "1": 0.002}
    assert second["progress"]["1"] == {"step": 5, "total_tokens": 1234, "total_samples": 0}
    assert second["ready"] == [False, True]
    assert third == second

    expected_hooks = [
        ["creation", 0, "run_a"],
        ["creation2", 0, "run_a"],
        ["creation", 1, "run_b"],
        ["creation2", 1, "run_b"],
        ["deletion", 0, "run_a"],
        ["creation", 0, "run_c"],
        ["creation2", 0, "run_c"],
    ]
    assert rank0["hooks"] == expected_hooks
    assert rank1["hooks"] == expected_hooks
