"""What state each run of an experiment is in, read from the experiment directory alone.

The CLI's `status` and the TUI's runs table both come from here, so they always agree.
Evicted, rejected and finished are the run's condition (`run_control.run_condition`, which
the supervisor and the trainer read too); an open run is active or waiting:

- evicted:  `control/evicted.txt` exists (reason from it)
- diverged: evicted by the trainer because its training diverged: the reason starts with
            `diverged:` (`RunCondition.status`); `evicted_by` is `trainer`
- rejected: `control/config_validation_error.txt` exists (reason from it), even for an
            `orch.toml` edited since: the trainer has yet to look at it again
- finished: `control/finished.txt` exists
- active:   the trainer (alive) holds a slot for it (`trainer/runs.json`)
- waiting:  anything else: no trainer yet, all slots used, or no `orch.toml` yet

A sweep adds what each run varies (`values`, from `sweep/plan.json`) and its standing in
early stopping (`asha`: its highest rung so far, from `sweep/asha.json`).

`RunStatusReader` reads them again and again at the cost of what changed: a run whose
files did not change costs a few `stat`s; `run_statuses` keeps one per experiment.

`supervisor_warnings` reads what the supervisor says is wrong without stopping anything
(experiment tracking failing, for one), from its state.json.

`read_experiment` is the one reading of a whole experiment that `workbench status`, the
TUI and `up`'s headless following each show in their own way: the runs, the supervisor's
state.json, whether that supervisor still runs, and what follows from them (the startup
phase, the warnings, the placement).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import tomlkit

from workbench.config import OrchestratorConfig
from workbench.files import layout, run_control, tinker_work
from workbench.files.nodes import NodeStatus, lost_nodes, node_statuses
from workbench.files.run_control import Condition, RunCondition
from workbench.supervisor.client import read_state, running_supervisor_pid
from workbench.supervisor.paths import rendezvous_path
from workbench.supervisor.startup import StartupPhase, startup_phase
from workbench.sweep.asha import RungResult, latest_by_run
from workbench.sweep.files import read_asha, read_plan_values
from workbench.system.file_change import SETTLE_NS, OnFileChange, Signature, settled, signature
from workbench.system.procfs import process_is_alive

STATUSES = ("waiting", "active", "rejected", "evicted", "diverged", "finished")


@dataclass
class RunStatus:
    id: str
    status: str
    step: int
    reason: str | None = None
    max_steps: int | None = None
    slot: int | None = None
    total_tokens: int = 0
    total_samples: int = 0
    evicted_by: str | None = None  # user, tui, trainer, orchestrator or asha
    values: dict[str, Any] | None = None  # what a sweep run varies (dotted keys)
    asha: dict[str, Any] | None = None  # rung, step, value, cutoff, rank, of, decision
    forked_from: dict[str, Any] | None = None  # run, step: `workbench runs fork`'s record
    # A Tinker client's run (`source = "tinker"`): when its client last sent work (unix s).
    last_request: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def describe_fork(forked_from: dict | None) -> str:
    """`run_a@20` for a run forked from run_a's step 20; empty for any other run."""
    if not forked_from:
        return ""
    return f"{forked_from.get('run')}@{forked_from.get('step')}"


def read_trainer_state(experiment: Path) -> dict[str, Any] | None:
    """The trainer's published state, or None if there is none or its trainer is gone."""
    try:
        state = json.loads(layout.trainer_state_path(experiment).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    pid = state.get("pid")
    if isinstance(pid, int) and not process_is_alive(pid):
        return None
    return state


def run_statuses(experiment: Path) -> list[RunStatus]:
    """Every run's status, read as `RunStatusReader` reads them: the process keeps one
    reader per experiment, so asking again (`status --watch`, a benchmark's checks) reads
    only the runs whose files changed since."""
    with _readers_lock:
        reader = _readers.get(experiment)
        if reader is None:
            reader = _readers[experiment] = RunStatusReader(experiment)
    return reader.read()


def supervisor_warnings(state: dict[str, Any] | None) -> list[str]:
    """The `warnings` of a supervisor's state.json (one line each); none if it has none."""
    warnings = (state or {}).get("warnings")
    if not isinstance(warnings, list):
        return []
    return [str(warning) for warning in warnings if warning]


@dataclass(frozen=True)
class ExperimentState:
    """An experiment read at unix time `now`: its runs, its supervisor's state.json (None
    before a supervisor wrote one) and the pid of its supervisor if one still runs."""

    path: Path
    runs: list[RunStatus]
    supervisor_state: dict[str, Any] | None
    supervisor_pid: int | None
    now: float

    @property
    def supervisor_running(self) -> bool:
        return self.supervisor_pid is not None

    @property
    def startup(self) -> StartupPhase | None:
        """The startup phase a live supervisor published; a dead supervisor's last phase
        says nothing about now."""
        return self.last_startup if self.supervisor_running else None

    @property
    def last_startup(self) -> StartupPhase | None:
        """The startup phase state.json holds, live supervisor or not: headless following
        says a supervisor's last phase (failed, for one) as it exits."""
        return startup_phase(self.supervisor_state)

    @property
    def warnings(self) -> list[str]:
        return supervisor_warnings(self.supervisor_state)

    @property
    def nodes(self) -> list[NodeStatus]:
        """The trainer's nodes, read now (`workbench.files.nodes`); [] on one node."""
        return trainer_nodes(self.path, self.supervisor_state, self.supervisor_running, self.now)

    @property
    def placement(self) -> str | None:
        """Which GPUs run inference and the trainer, as the supervisor recorded it."""
        return (self.supervisor_state or {}).get("placement") or None


def trainer_nodes(
    experiment: Path, state: dict[str, Any] | None, supervisor_running: bool, now: float
) -> list[NodeStatus]:
    """Every node of the experiment's trainer, node 0 from `state` (the supervisor's, shown
    `stopped` once no supervisor runs), the others from `nodes/`; [] on one node."""
    try:
        rendezvous = json.loads(rendezvous_path(experiment).read_text(encoding="utf-8"))
        nnodes = int(rendezvous["nnodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    trainer = ((state or {}).get("processes") or {}).get("trainer")
    if not supervisor_running and isinstance(trainer, dict):
        trainer = {**trainer, "state": "stopped"}
    host = rendezvous.get("node0_host") if isinstance(rendezvous, dict) else None
    return node_statuses(experiment, nnodes, host, trainer, now)


def node_warnings(nodes: list[NodeStatus], supervisor_running: bool) -> list[str]:
    """One line per joined node that is not there while the experiment runs, naming it;
    none once it stopped (the nodes stopped with it)."""
    if not supervisor_running:
        return []
    return [
        f"node {node.node_rank} ({node.host or 'unknown host'}) "
        f"{'is silent' if node.state == 'silent' else node.state}: {node.note}"
        for node in lost_nodes(nodes)
    ]


def read_experiment(
    experiment: Path,
    *,
    read_runs: Callable[[Path], list[RunStatus]] = run_statuses,
    read_supervisor_state: Callable[[Path], dict[str, Any] | None] = read_state,
    supervisor_pid: Callable[[Path], int | None] = running_supervisor_pid,
) -> ExperimentState:
    """The experiment as it is now. A caller that keeps readers between reads (the TUI
    reads only what changed) passes them for the runs, the state.json and the pid."""
    return ExperimentState(
        path=experiment,
        runs=read_runs(experiment),
        supervisor_state=read_supervisor_state(experiment),
        supervisor_pid=supervisor_pid(experiment),
        now=time.time(),
    )


def _standing(result: RungResult) -> dict[str, Any]:
    return {
        "rung": result.rung,
        "step": result.step,
        "value": result.value,
        "cutoff": result.cutoff,
        "rank": result.rank,
        "of": result.of,
        "decision": result.decision,
    }


@dataclass(frozen=True)
class RunFiles:
    """What one run's own files say of it; the trainer's view is added per read."""

    condition: RunCondition
    broadcast_step: int  # the newest STABLE broadcast, 0 without one
    has_config: bool  # control/orch.toml exists
    # A broadcast newer than `broadcast_step` is being written: its STABLE marker lands
    # inside its own directory, which none of `watched_paths` shows.
    broadcast_pending: bool
    # When the newest Tinker work item arrived (the work queue's mtime); None for a run
    # no Tinker client drives.
    last_request: float | None = None


def watched_paths(run: Path, files: RunFiles | None) -> tuple[str, ...]:
    """What to `stat` to learn that what `read_run_files` read of `run` may have changed:
    control/ always (a control file written, renamed over or removed: how a run is
    evicted, finished, rejected or restarted); while the run is open or rejected, its
    orch.toml too (edited in place, no rename shows in control/); while it is open,
    broadcast/ (a step added) and its Tinker work queue (a request renamed in; absent for
    a run no client drives). An evicted or finished run costs one `stat`. Without `files`
    (not read yet), all of them."""
    kind = files.condition.kind if files is not None else Condition.OPEN
    paths = [str(layout.control_dir(run))]
    if kind in (Condition.OPEN, Condition.REJECTED):
        paths.append(str(layout.orch_config_path(run)))
    if kind is Condition.OPEN:
        paths.append(str(layout.broadcasts_dir(run)))
        paths.append(str(tinker_work.work_dir(run)))
    return tuple(paths)


def read_run_files(run: Path) -> RunFiles:
    steps = layout.list_step_dirs(layout.broadcasts_dir(run))
    stable = [step for step, path in steps if layout.is_stable(path)]
    broadcast_step = stable[-1] if stable else 0
    return RunFiles(
        condition=run_control.run_condition(run),
        broadcast_step=broadcast_step,
        has_config=layout.orch_config_path(run).is_file(),
        broadcast_pending=bool(steps) and steps[-1][0] > broadcast_step,
        last_request=_mtime(tinker_work.work_dir(run)),
    )


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def run_status(
    run_id: str,
    files: RunFiles,
    slots: dict[str, int],
    progress: dict[str, Any],
    max_steps: int | None,
) -> RunStatus:
    """A run's status from its files and the trainer's published slots and progress."""
    trained = progress.get(run_id, {})
    status = RunStatus(
        id=run_id,
        status="waiting",
        step=max(int(trained.get("step", 0)), files.broadcast_step),
        max_steps=max_steps,
        slot=slots.get(run_id),
        total_tokens=int(trained.get("total_tokens", 0)),
        total_samples=int(trained.get("total_samples", 0)),
        last_request=files.last_request,
    )
    condition = files.condition
    if condition.kind in (Condition.EVICTED, Condition.REJECTED):
        status.status, status.reason, status.slot = condition.status, condition.reason, None
        status.evicted_by = condition.evicted_by
    elif condition.kind is Condition.FINISHED:
        status.status = condition.kind.value
    elif run_id in slots:
        status.status = "active"
    elif not files.has_config:
        status.reason = "no control/orch.toml yet"
    return status


@dataclass(frozen=True)
class _KnownRun:
    """One run as a reader last read it."""

    watched: tuple[str, ...]  # `watched_paths`
    signatures: tuple[Signature, ...] | None  # of `watched`; None: read again next time
    files: RunFiles
    settings: RunSettings
    orch_config: OnFileChange[RunSettings]  # parsed only when orch.toml changes


class RunStatusReader:
    """The statuses of one experiment's runs, read again and again at a cost that follows
    what changed rather than how many runs there are.

    A run's own files (`read_run_files`) are read again only when the signature of one of
    its `watched_paths` changes (one to three `stat`s for a run that did not), its orch.toml
    parsed for `max_steps` and `forked_from` only when that file changes, the list of runs only when the
    experiment directory changes, and the sweep's plan and decisions only when their
    files change. What changes for every run at once (the trainer's slots and progress)
    is one file, combined with the rest without further reads. `files_read` counts the
    runs whose files were read. One reader may be shared by threads (a lock guards it).
    """

    def __init__(self, experiment: Path, settle_ns: int = SETTLE_NS) -> None:
        self.experiment = experiment
        self._settle_ns = settle_ns
        self._lock = threading.Lock()
        self._known: dict[str, _KnownRun] = {}
        self._run_dirs: tuple[tuple[Signature] | None, list[tuple[str, Path]]] = (None, [])
        self._plan = OnFileChange(
            layout.sweep_plan_path(experiment), partial(read_plan_values, experiment), settle_ns
        )
        self._asha = OnFileChange(
            layout.asha_state_path(experiment), partial(read_asha, experiment), settle_ns
        )
        self.files_read = 0
        # Each run's status and what it was made of: a run whose inputs are the same
        # objects (or equal values) keeps its status object, which readers compare first.
        self._statuses: dict[str, tuple[tuple[Any, ...], RunStatus]] = {}
        self._pruned_for: list[tuple[str, Path]] | None = None  # the listing pruned for

    def read(self, changed: AbstractSet[str] | None = None) -> list[RunStatus]:
        """Every run's status. `changed`: the runs whose files may have changed since the
        last read, as the change feed tells (`workbench.files.experiment_changes`); the others are
        not even `stat`ed, unless their last read was too recent to trust. None: any."""
        with self._lock:
            return self._read(changed)

    def _read(self, changed: AbstractSet[str] | None) -> list[RunStatus]:
        trainer = read_trainer_state(self.experiment) or {}
        slots = {run_id: int(idx) for idx, run_id in trainer.get("slots", {}).items()}
        progress = trainer.get("progress", {})
        values = self._plan.get()
        asha = self._asha.get()
        standings = latest_by_run(asha.results) if asha is not None else {}
        runs = self._list_runs()
        if runs is not self._pruned_for:  # listed again: some runs may be gone
            listed = {run_id for run_id, _ in runs}
            for gone in set(self._known) - listed:
                del self._known[gone]
                self._statuses.pop(gone, None)
            self._pruned_for = runs
        statuses = []
        for run_id, run in runs:
            known = self._known.get(run_id)
            if changed is None or run_id in changed or known is None or known.signatures is None:
                known = self._current(run)
            inputs = (
                known,
                slots.get(run_id),
                progress.get(run_id),
                values.get(run_id),
                standings.get(run_id),
            )
            last = self._statuses.get(run_id)
            if last is not None and _same_inputs(last[0], inputs):
                statuses.append(last[1])
                continue
            status = run_status(run_id, known.files, slots, progress, known.settings.max_steps)
            status.forked_from = known.settings.forked_from
            status.values = values.get(run_id)
            if run_id in standings:
                status.asha = _standing(standings[run_id])
            self._statuses[run_id] = (inputs, status)
            statuses.append(status)
        return statuses

    def _list_runs(self) -> list[tuple[str, Path]]:
        """Every run's id and directory, listed again only when the experiment directory
        changes."""
        current = (signature(self.experiment),)
        known, runs = self._run_dirs
        if known != current:
            trusted = settled(current, time.time_ns(), self._settle_ns)
            runs = [(run.name, run) for run in layout.list_run_dirs(self.experiment)]
            self._run_dirs = (current if trusted else None, runs)
        return runs

    def _current(self, run: Path) -> _KnownRun:
        """What `run`'s files say, read again only if they changed (or changed too
        recently to tell)."""
        known = self._known.get(run.name)
        if (
            known is not None
            and known.signatures is not None
            and tuple(signature(path) for path in known.watched) == known.signatures
        ):
            return known
        # Signed before the read: a change during it shows as a new signature next time.
        now_ns = time.time_ns()
        before = {path: signature(path) for path in watched_paths(run, None)}
        files = read_run_files(run)
        self.files_read += 1
        watched = watched_paths(run, files)
        signatures = tuple(before[path] for path in watched)
        trusted = not files.broadcast_pending and settled(signatures, now_ns, self._settle_ns)
        if known is None:
            path = layout.orch_config_path(run)
            orch_config = OnFileChange(path, partial(_read_settings, path), self._settle_ns)
        else:
            orch_config = known.orch_config
        known = _KnownRun(
            watched, signatures if trusted else None, files, orch_config.get(), orch_config
        )
        self._known[run.name] = known
        return known


def _same_inputs(before: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    """The run's files as the same `_KnownRun` object, its slot, progress, sweep values
    and standing equal."""
    return before[0] is now[0] and before[1:] == now[1:]


_readers: dict[Path, RunStatusReader] = {}
_readers_lock = threading.Lock()


@dataclass(frozen=True)
class RunSettings:
    """What a run's status shows of its orch.toml; None where it does not parse."""

    max_steps: int | None = None  # None too for a Tinker client's run: its client decides
    forked_from: dict[str, Any] | None = None


def _read_settings(path: Path) -> RunSettings:
    # Read leniently: a broken orch.toml is reported as a rejection, not a crash here.
    with contextlib.suppress(Exception):
        document = tomlkit.parse(path.read_text(encoding="utf-8")).unwrap()
        max_steps = document.get("max_steps", OrchestratorConfig.model_fields["max_steps"].default)
        forked_from = document.get("forked_from")
        if not isinstance(forked_from, dict):
            forked_from = None
        if document.get("source") == tinker_work.SOURCE_TINKER:
            return RunSettings(None, forked_from)
        return RunSettings(int(max_steps), forked_from)
    return RunSettings()
