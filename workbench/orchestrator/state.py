"""The orchestrator's own checkpoint: step, data position, RNG, empty-batch streak.

Written after every step to `checkpoints/step_N/orchestrator/state.json` (staged, STABLE
last; one small file, so every step is cheap to keep) and pruned to the last few. On
restart the orchestrator continues from the newest STABLE one.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.files import layout

PART = "orchestrator"


@dataclass
class OrchestratorState:
    step: int = 0  # the next rollout step to generate
    data_position: int = 0  # the next prompt index of the environment's stream
    empty_batches: int = 0  # consecutive batches without learning signal
    rng_state: list | None = None  # random.Random.getstate(), JSON-friendly

    def rng(self, seed: int) -> random.Random:
        rng = random.Random(seed)
        if self.rng_state is not None:
            version, internal, gauss = self.rng_state
            rng.setstate((version, tuple(internal), gauss))
        return rng

    def remember_rng(self, rng: random.Random) -> None:
        version, internal, gauss = rng.getstate()
        self.rng_state = [version, list(internal), gauss]


def remove_killed_writes(run: Path) -> None:
    """Remove what an orchestrator killed mid-write (SIGKILL, OOM) left in its run: the temp
    file of `samples.jsonl`, staged rollout steps and staged checkpoints of its own part.
    Only while no orchestrator of the run runs: when one starts, and when the supervisor
    has seen one exit (after `workbench down` nothing else would remove them)."""
    layout.remove_staging(run, layout.samples_path(run).name)
    layout.remove_staging(layout.rollouts_dir(run))
    for _, step in layout.list_step_dirs(layout.checkpoints_dir(run)):
        layout.remove_staging(step, PART)


def save_state(run: Path, state: OrchestratorState, keep: int = 2) -> Path:
    final = layout.checkpoint_part_dir(run, state.step, PART)
    with layout.staged_directory(final) as staging:
        (staging / "state.json").write_text(json.dumps(asdict(state)))
    steps = [
        step
        for step, path in layout.list_step_dirs(layout.checkpoints_dir(run))
        if layout.is_stable(path / PART)
    ]
    for step in steps[:-keep]:
        shutil.rmtree(layout.checkpoint_part_dir(run, step, PART), ignore_errors=True)
        step_dir = layout.checkpoint_dir(run, step)
        if step_dir.is_dir() and not any(step_dir.iterdir()):
            step_dir.rmdir()
    return final


def load_state(run: Path) -> OrchestratorState | None:
    step = layout.latest_checkpoint_step(run, PART)
    if step is None:
        return None
    data = json.loads((layout.checkpoint_part_dir(run, step, PART) / "state.json").read_text())
    return OrchestratorState(**data)
