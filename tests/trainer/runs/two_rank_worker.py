"""Run under `torchrun --nproc_per_node 2`: both ranks follow the master through run changes.

Writes `{out}/rank{N}.json` with every rank's view after each phase, and the order in which
its creation and deletion hooks ran, for tests/trainer/runs/test_two_ranks.py to compare.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import torch.distributed as dist

from workbench.trainer.runs.manager import MultiRunManager


def make_run(experiment: Path, run_id: str, orch_toml: str) -> None:
    control = experiment / run_id / "control"
    control.mkdir(parents=True, exist_ok=True)
    (control / "orch.toml").write_text(orch_toml)


def snapshot(manager) -> dict:
    return {
        "idx_2_id": {str(k): v for k, v in sorted(manager.idx_2_id.items())},
        "id_2_idx": dict(sorted(manager.id_2_idx.items())),
        "progress": {str(k): asdict(p) for k, p in sorted(manager.progress.items())},
        "lr": {str(k): c.lr for k, c in sorted(manager.config.items())},
        "ready": list(manager.ready_to_update),
    }


def main(experiment: Path, out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    manager = MultiRunManager(experiment, max_runs=2)
    hook_calls: list[list] = []
    manager.register_deletion_hook(lambda idx, rid: hook_calls.append(["deletion", idx, rid]))
    manager.register_creation_hook(lambda idx, rid: hook_calls.append(["creation", idx, rid]))
    manager.register_creation_hook(lambda idx, rid: hook_calls.append(["creation2", idx, rid]))
    phases = []

    def phase(change):
        if rank == 0:
            change()
            manager.discover_runs()
        manager.synchronize_state()
        phases.append(snapshot(manager))
        dist.barrier()

    def first():
        make_run(experiment, "run_a", "lr = 0.001\n")
        make_run(experiment, "run_b", "lr = 0.002\n")
        make_run(experiment, "run_c", "lr = 0.003\n")  # waits: two slots

    def second():
        manager.progress[manager.id_2_idx["run_b"]].step = 5
        manager.progress[manager.id_2_idx["run_b"]].total_tokens = 1234
        manager.ready_to_update[manager.id_2_idx["run_b"]] = True
        shutil.rmtree(experiment / "run_a")  # run_c takes its slot

    phase(first)
    phase(second)
    phase(lambda: None)  # nothing changes: no hooks may run again
    (out / f"rank{rank}.json").write_text(json.dumps({"phases": phases, "hooks": hook_calls}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
