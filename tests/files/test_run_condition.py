"""A run's condition has one owner (`run_control.run_condition`), so every reader agrees on
it: `workbench status`, the TUI, the supervisor's discovery and the trainer, for every
combination of a run's control files."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import make_run
from workbench import status
from workbench.files import layout, run_control
from workbench.files.run_control import Condition, RunCondition
from workbench.supervisor.discovery import scan_run
from workbench.trainer.runs.manager import MultiRunManager
from workbench.tui.data import ExperimentReader

RUN = "run_a"
EVICTED_WHY = "reward collapsed"
REJECTED_WHY = "control/orch.toml: env: unknown environment 'nope'"

# How the run was rejected, if it was.
SIGNED = "naming its orch.toml"  # as the trainer and the orchestrator write it
EDITED = "orch.toml replaced since"  # the user fixed the file after the rejection
UNSIGNED = "naming no orch.toml"  # an older writer: stands while newer than the file
UNSIGNED_OLDER = "naming no orch.toml, older than it"


@dataclass(frozen=True)
class Files:
    evicted: bool
    rejection: str | None
    finished: bool
    config_removed: bool  # control/orch.toml deleted after everything else

    def expected(self) -> RunCondition:
        """The condition, worked out here by hand from what was written."""
        if self.evicted:
            return RunCondition(Condition.EVICTED, reason=EVICTED_WHY, evicted_by="user")
        if self.rejection is not None:
            stands = {
                SIGNED: not self.config_removed,  # else it names a file that is gone
                EDITED: False,
                UNSIGNED: True,
                UNSIGNED_OLDER: self.config_removed,  # older than a file while there is one
            }[self.rejection]
            return RunCondition(
                Condition.REJECTED,
                reason=REJECTED_WHY,
                reconsidered=not stands and not self.finished,
            )
        if self.finished:
            return RunCondition(Condition.FINISHED)
        return RunCondition(Condition.OPEN)

    def write(self, run: Path) -> None:
        """Write the control files over a run whose handshake wrote a valid orch.toml."""
        config = layout.orch_config_path(run)
        if self.evicted:
            run_control.write_eviction(run, EVICTED_WHY, by="user")
        if self.rejection in (SIGNED, EDITED):
            signature = run_control.current_config_signature(run)
            run_control.write_validation_error(run, REJECTED_WHY, signature)
            if self.rejection == EDITED:
                layout.atomic_write_text(config, "lr = 0.002\n")  # a new file: a new inode
        elif self.rejection in (UNSIGNED, UNSIGNED_OLDER):
            run_control.write_validation_error(run, REJECTED_WHY)
            stamp = config.stat().st_mtime_ns
            stamp += 10**9 if self.rejection == UNSIGNED else -(10**9)
            os.utime(layout.validation_error_path(run), ns=(stamp, stamp))
        if self.finished:
            run_control.mark_finished(run, 10)
        if self.config_removed:
            config.unlink()


COMBINATIONS = [
    Files(*values)
    for values in itertools.product(
        (False, True),
        (None, SIGNED, EDITED, UNSIGNED, UNSIGNED_OLDER),
        (False, True),
        (False, True),
    )
]


def _name(files: Files) -> str:
    parts = [
        "evicted" if files.evicted else "",
        f"rejected {files.rejection}" if files.rejection else "",
        "finished" if files.finished else "",
        "orch.toml removed" if files.config_removed else "",
    ]
    return ", ".join(part for part in parts if part) or "nothing"


def _as_condition(shown: str, reason: str | None) -> tuple[Condition, str | None]:
    """A status as `workbench status` and the TUI show it: active and waiting runs are
    open (a waiting run's reason is not about its control files)."""
    if shown in ("active", "waiting"):
        return Condition.OPEN, None
    return Condition(shown), reason


def seen_by_status(experiment: Path) -> tuple[Condition, str | None]:
    (run,) = status.run_statuses(experiment)
    return _as_condition(run.status, run.reason)


def seen_by_tui(experiment: Path) -> tuple[Condition, str | None]:
    view = ExperimentReader(experiment, supervisor_pid=lambda _: None).poll().run(RUN)
    assert view is not None
    return _as_condition(view.status, view.reason)


def seen_by_supervisor(run: Path) -> tuple[Condition, str | None]:
    scan = scan_run(run)
    for held in (Condition.EVICTED, Condition.REJECTED):
        if scan.hold_reason is not None and scan.hold_reason.startswith(f"{held}: "):
            return held, scan.hold_reason.removeprefix(f"{held}: ")
    # Held for a missing or invalid orch.toml, or runnable: nothing in control/ holds it.
    return (Condition.FINISHED if scan.finished else Condition.OPEN), None


def assert_every_reader_sees(experiment: Path, expected: RunCondition) -> None:
    run = experiment / RUN
    assert run_control.run_condition(run) == expected
    shown = (expected.kind, expected.reason)
    assert seen_by_status(experiment) == shown, "workbench status"
    assert seen_by_tui(experiment) == shown, "the TUI"
    assert seen_by_supervisor(run) == shown, "the supervisor's discovery"


@pytest.mark.parametrize("files", COMBINATIONS, ids=_name)
def test_every_reader_sees_the_condition_and_the_trainer_takes_only_open_runs(
    experiment: Path, files: Files
):
    run = make_run(experiment, RUN)
    files.write(run)
    expected = files.expected()
    assert_every_reader_sees(experiment, expected)

    trainer = MultiRunManager(experiment, max_runs=2)
    trainer.discover_runs()
    # Without an orch.toml a run has not finished its handshake: no trainer takes it.
    taken = RUN in trainer.id_2_idx
    assert taken == (expected.open_to_trainer and not files.config_removed), "the trainer"
    # What the trainer took is open to everyone: a rejection it looked at again is cleared.
    after = run_control.run_condition(run)
    assert after == (RunCondition(Condition.OPEN) if taken else expected)
    assert_every_reader_sees(experiment, after)


@pytest.mark.parametrize("files", COMBINATIONS, ids=_name)
def test_a_trainer_holding_the_run_keeps_it_only_while_it_may_take_it_anew(
    experiment: Path, files: Files
):
    run = make_run(experiment, RUN)
    trainer = MultiRunManager(experiment, max_runs=2)
    trainer.discover_runs()
    assert RUN in trainer.id_2_idx
    files.write(run)
    trainer.discover_runs()
    # An open run keeps its slot. One rejected since it was taken leaves it; when its
    # orch.toml changed after the rejection, the same discovery takes it again as it would
    # a new run: if the file is there (and valid).
    condition = files.expected()
    expected = condition.kind is Condition.OPEN or (
        condition.open_to_trainer and not files.config_removed
    )
    assert (RUN in trainer.id_2_idx) == expected


def test_a_divergence_is_an_eviction_to_the_processes_and_diverged_to_people(experiment: Path):
    run = make_run(experiment, RUN)
    why = "diverged: gradient norm nan at updates 3-5; try a lower lr in a new run"
    run_control.write_eviction(run, why, by="trainer")
    condition = run_control.run_condition(run)
    assert condition == RunCondition(Condition.EVICTED, reason=why, evicted_by="trainer")
    assert condition.diverged and condition.status == "diverged"
    assert seen_by_supervisor(run) == (Condition.EVICTED, why)
    trainer = MultiRunManager(experiment, max_runs=2)
    trainer.discover_runs()
    assert RUN not in trainer.id_2_idx
    (shown,) = status.run_statuses(experiment)
    assert (shown.status, shown.reason, shown.evicted_by) == ("diverged", why, "trainer")
    view = ExperimentReader(experiment, supervisor_pid=lambda _: None).poll().run(RUN)
    assert view is not None and (view.status, view.reason) == ("diverged", why)
    # Only the trainer's reason makes a divergence: the word elsewhere does not.
    run_control.clear_eviction(run)
    run_control.write_eviction(run, "loss diverged, stopped by hand", by="user")
    assert run_control.run_condition(run).status == "evicted"
