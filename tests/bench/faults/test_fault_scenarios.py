"""The fast fault scenarios on the real system (vLLM's CPU build, the torchrun trainer,
orchestrators, the supervisor): each injected once into a two-run experiment, then every
promise checked. Minutes each; the long scenarios live in `workbench bench faults`."""

from __future__ import annotations

from pathlib import Path
from random import Random

import pytest

from workbench.bench.faults.runner import run_scenario
from workbench.bench.faults.scenarios import BY_NAME

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow

SIZE = {"max_steps": 8, "checkpoint_interval": 3}


@pytest.mark.parametrize(
    "name",
    [
        "kill-orchestrator",
        "kill-trainer-worker",
        "sigterm-in-checkpoint",
        "delete-run-dir",
        "kill-supervisor-down",
    ],
)
def test_after_the_fault_every_run_completes_and_nothing_is_lost_or_left(name: str, tmp_path: Path):
    record = run_scenario(BY_NAME[name], tmp_path, Random(f"0:{name}"), **SIZE)
    assert record["injected"] >= 1, record["notes"]
    assert record["completed"] == record["expected_runs"], record["notes"]
    assert record["recomputed_steps_max"] <= record["checkpoint_interval"], record
    assert record["incomplete_loaded"] == 0 and record["resumed_not_from_latest"] == [], record
    assert record["half_written"] == [], record
    assert record["orphans"] == [], record
    assert not record["deleted_run_recreated"], record
