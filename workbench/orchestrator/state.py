"""The orchestrator's own checkpoint: step, data position, RNG, empty-batch streak, and
where a starting orchestrator resumes (`resume_state`).

Written after every step to `checkpoints/step_N/orchestrator/state.json` (staged, STABLE
last; one small file, so every step is cheap to keep) and pruned to the last few. On
restart the orchestrator continues from the newest STABLE one the trainer can follow; a
run started from another run's checkpoint (copied by hand or by `workbench runs fork`)
may hold only the trainer's part, and then starts at the trainer's step.
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


def load_state(run: Path, step: int | None = None) -> OrchestratorState | None:
    """The state kept at `step` (default: the newest STABLE one), or None."""
    step = layout.latest_checkpoint_step(run, PART) if step is None else step
    if step is None or not layout.is_stable(layout.checkpoint_part_dir(run, step, PART)):
        return None
    data = json.loads((layout.checkpoint_part_dir(run, step, PART) / "state.json").read_text())
    return OrchestratorState(**data)


def trained_step(run: Path) -> int:
    """The step the trainer will hand this run's next adapter after: its newest broadcast
    or, when it has none (yet) that far, its newest trainer checkpoint, which the trainer
    resumes from and publishes (`workbench.trainer.rl.trainer.build_trainer`)."""
    return max(
        layout.latest_stable_step(layout.broadcasts_dir(run)) or 0,
        layout.latest_checkpoint_step(run, "trainer") or 0,
    )


def _followable(run: Path, state_step: int, trained: int) -> bool:
    """Can the trainer, at `trained`, reach a state that generates `state_step` next? Only
    if every batch in between is on disk: a run made from another run's checkpoints has
    none of them, and the trainer would wait for `rollouts/step_{trained}` for ever."""
    return all(
        layout.is_stable(layout.rollout_dir(run, step)) for step in range(trained, state_step)
    )


def resume_state(run: Path, prompts_per_step: int) -> tuple[OrchestratorState, str | None]:
    """Where a starting orchestrator begins, and a note for its log when it is not simply
    its own newest state (None then).

    The newest kept state the trainer can follow (see `_followable`). When the trainer is
    ahead of it, or there is none (a checkpoint with the trainer's part only), the run
    starts at the trainer's step: a step the trainer has trained is never generated
    again, and the prompts those steps would have taken are taken as used
    (`prompts_per_step` each; batches dropped for lack of signal are not counted then).
    """
    trained = trained_step(run)
    steps = layout.checkpoint_steps(run, PART)
    usable = [step for step in steps if _followable(run, step, trained)]
    state = load_state(run, usable[-1]) if usable else None
    note = None
    if state is None:
        state = OrchestratorState()
        if trained:
            note = (
                f"starts from the trainer's checkpoint at step {trained} without an "
                f"orchestrator state there (kept: {_listing(steps)}): the adapter, optimizer "
                f"and schedule are step {trained}'s; data position {trained * prompts_per_step} "
                f"({trained} steps of {prompts_per_step} prompts) and sampling seeds afresh"
            )
    elif usable[-1] != steps[-1]:
        note = (
            f"resumes from its orchestrator state at step {usable[-1]}, not the newer "
            f"{_listing([s for s in steps if s > usable[-1]])}: the batches between the "
            f"trainer's step {trained} and those are not in rollouts/"
        )
    if trained > state.step:
        # The trainer is ahead of our checkpoint (it was lost): never regenerate a step
        # the trainer has already trained.
        state.data_position += (trained - state.step) * prompts_per_step
        state.step = trained
    return state, note


def _listing(steps: list[int]) -> str:
    return ", ".join(f"step {step}" for step in steps) or "none"
