"""The supervisor: one per experiment; starts, watches, restarts and stops every child.

`Supervisor` is the core and runs on one thread: each tick it answers control requests,
reaps exits, checks readiness, reconciles orchestrators with the run directories
(discovery) and starts what is due, then writes state.json if anything changed. It only
turns what happens into events for each process's lifecycle
(`workbench.supervisor.lifecycle`, where every state change is decided). The run
directory watcher's thread and the control socket only wake it up.

Start order: the plan's processes in order (inference, then trainer); orchestrators once
the processes they require (inference) are ready. Stop order: orchestrators first, then
the plan's processes in reverse (trainer, then inference), each stage finished before the
next begins.

`run_daemon` is the process around it (`python -m workbench.supervisor`): the pid file
lock that makes a second supervisor for the same experiment refuse, clean-up of children
left by a supervisor that was killed, the plan, and signal handling (SIGTERM/SIGINT stop
everything cleanly).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from workbench.alerts import AlertWatcher
from workbench.config import ConfigError, normalize_run_id
from workbench.experiment import write_run
from workbench.files import layout, run_control
from workbench.files.alerts import Alert
from workbench.orchestrator.state import remove_killed_writes
from workbench.supervisor import paths
from workbench.supervisor.client import STATE_HEARTBEAT_S
from workbench.supervisor.control_socket import (
    COMMANDS,
    ControlError,
    ControlServer,
    new_run_config,
)
from workbench.supervisor.discovery import (
    RUN_DELETED,
    OrchConfigValidator,
    OrchestratorView,
    RunDirectoryWatcher,
    RunScan,
    StartOrchestrator,
    StopOrchestrator,
    reconcile,
    scan_run,
    scan_runs,
)
from workbench.supervisor.fork import fork_run
from workbench.supervisor.launch import (
    EXIT_ALREADY_RUNNING,
    EXIT_PLAN_FAILED,
    already_running_message,
    kill_leftovers,
)
from workbench.supervisor.lifecycle import (
    COMING_UP_STATES,
    SHUTDOWN_STATUSES,
    TERMINAL_STATES,
    UP_STATES,
    Event,
    ExitFacts,
    ProcessState,
    SupervisorStatus,
)
from workbench.supervisor.plan import DEFAULT_PLAN, Plan, PlanError, load_plan_factory
from workbench.supervisor.process import (
    ExitRecord,
    ProcessSpec,
    SupervisedProcess,
)
from workbench.supervisor.startup import ProcessFacts, StartupTracker
from workbench.sweep.schedulers import start_scheduler
from workbench.system.clock import now_iso, unix_time
from workbench.tracking import MetricsForwarder, start_forwarding

log = logging.getLogger("workbench.supervisor")

EXIT_OK = 0
TICK_S = 0.2
# While a run directory that came before its control/orch.toml is this new, the loop ticks
# every AWAITING_TICK_S: `workbench runs add` makes the directory, then writes the file,
# and no event tells of the file (see `discovery`).
AWAITING_TICK_S = 0.02
AWAITING_FAST_S = 2.0
RESCAN_S = 2.0


class AlreadyRunning(Exception):
    def __init__(self, experiment: Path, pid: int | None):
        self.pid = pid
        super().__init__(already_running_message(experiment, pid))


class SupervisorLock:
    """`supervisor/supervisor.pid`, flock-ed for the supervisor's whole life.

    The kernel drops the lock when the process dies however it dies, so a stale pid file
    never blocks a new supervisor. Children do not inherit the descriptor (close_fds).
    """

    def __init__(self, experiment: Path):
        self.experiment = experiment
        self.path = paths.pid_path(experiment)
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 64).decode(errors="replace").strip()
            os.close(fd)
            raise AlreadyRunning(self.experiment, int(text) if text.isdigit() else None) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        # Emptied, not removed: a starter waiting on this inode must not lock a dead file.
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None


class Supervisor:
    """Runs a `Plan` for one experiment until asked to stop (or, with `exit_when_done`,
    until every run is finished, evicted, rejected or failed)."""

    def __init__(
        self,
        experiment: Path,
        plan: Plan,
        *,
        exit_when_done: bool = False,
        tick_s: float = TICK_S,
        rescan_s: float = RESCAN_S,
    ):
        self.experiment = Path(experiment).resolve()
        self.plan = plan
        self.exit_when_done = exit_when_done
        self.tick_s = tick_s
        self.rescan_s = rescan_s
        self.status = SupervisorStatus.STARTING
        self.started_at = now_iso()
        self.processes: dict[str, SupervisedProcess] = {}
        for spec in plan.processes:
            if spec.name in self.processes:
                raise PlanError(f"two processes are named {spec.name!r}")
            self.processes[spec.name] = SupervisedProcess(spec)
        self._fixed = [spec.name for spec in plan.processes]
        self.startup = StartupTracker(self.experiment, self.started_at)
        self._wake = threading.Event()
        self._discovery_due = True
        self._next_rescan = 0.0
        self._validator = OrchConfigValidator()
        self._scans: dict[str, RunScan] = {}
        self._awaiting_since: dict[str, float] = {}  # run id -> when first seen awaiting
        self._stop_reason: str | None = None
        self._shutdown_stages: list[list[str]] = []
        self._last_state: str | None = None
        self._state_written_at = -float("inf")  # time.monotonic() of the last write
        self.control: ControlServer | None = None
        self.watcher: RunDirectoryWatcher | None = None
        self.tracking: MetricsForwarder | None = None
        self._faults: dict[str, float] = {}
        self.early_stopping = (
            start_scheduler(self.experiment, plan.early_stopping, fork_run)
            if plan.early_stopping is not None
            else None
        )
        self.alerts = AlertWatcher(self.experiment, plan.alerts, on_alert=self._alert_tracker)

    # -------------------------------------------------------------- loop

    def run(self) -> int:
        """Serve until stopped; children are always stopped before this returns."""
        for note in self.plan.notes:
            log.info("%s", note)
        self.control = ControlServer(paths.socket_path(self.experiment), self._wake)
        self.control.start()
        self.watcher = RunDirectoryWatcher(self.experiment, self.notice_change)
        self.watcher.start()
        self.tracking = start_forwarding(self.experiment, self.plan.tracking)
        log.info("supervising %s (pid %d)", self.experiment, os.getpid())
        try:
            while self.status != SupervisorStatus.STOPPED:
                try:
                    self.tick()
                except Exception as err:
                    # A fault here (disk full, a bug) must not take training down with it:
                    # the children keep running and the next tick tries again.
                    self._log_fault(err)
                if self.status == SupervisorStatus.STOPPED:
                    break
                self._wake.wait(self._next_wait(time.monotonic()))
                self._wake.clear()
        except BaseException:
            log.exception("supervisor loop crashed; stopping every child")
            self._emergency_stop()
            raise
        finally:
            self.watcher.stop()
            self.control.close()
            if self.tracking is not None:  # after the children: their last records go too
                self.tracking.stop()
            with contextlib.suppress(OSError):
                self._publish_state()
        log.info("stopped (%s)", self._stop_reason)
        return EXIT_OK

    def tick(self) -> None:
        now = time.monotonic()
        self._serve_requests(now)
        if self._stop_reason is not None and self.status not in SHUTDOWN_STATUSES:
            self._begin_shutdown()
        for proc in list(self.processes.values()):
            self._poll(proc, now)
        if self.status == SupervisorStatus.STOPPING:
            self._advance_shutdown(now)
        else:
            if self._discovery_due or now >= self._next_rescan or self._config_arrived():
                self._discover(now)
            self._stop_early(now)
            self._start_due(now)
            if self.status == SupervisorStatus.STARTING and all(
                self.processes[name].state not in COMING_UP_STATES for name in self._fixed
            ):
                self.status = SupervisorStatus.RUNNING
            if self.exit_when_done:
                self._stop_when_done()
            self._check_alerts()
        self._publish_state()

    def _log_fault(self, err: Exception) -> None:
        message = f"{type(err).__name__}: {err}"
        now = time.monotonic()
        # Once a minute per distinct fault: a full disk must not also fill the log.
        if self._faults.get(message, -60.0) + 60.0 <= now:
            self._faults[message] = now
            log.exception("supervisor tick failed (children keep running): %s", message)

    def _check_alerts(self) -> None:
        """The alert rules over what the runs recorded and the processes' failed exits
        (`workbench.alerts`); a fault there (a full disk) is logged, and the loop goes on."""
        failures = {
            proc.name: [
                at
                for record in proc.exits
                if not record.ok
                and not record.stop_requested
                and (at := unix_time(record.time)) is not None
            ]
            for proc in self.processes.values()
        }
        try:
            self.alerts.poll(failures)
        except Exception as err:
            self._log_fault(err)

    def _alert_tracker(self, alert: Alert) -> None:
        if self.tracking is not None:
            self.tracking.alert(alert)

    def request_stop(self, reason: str) -> None:
        """Stop everything and exit (safe from another thread; signal handlers go through
        `_outside_handler`)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._wake.set()

    def notice_change(self) -> None:
        """Something under the experiment changed (from the watcher's thread): rescan soon."""
        self._discovery_due = True
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    # -------------------------------------------------------------- processes

    def _poll(self, proc: SupervisedProcess, now: float) -> None:
        record = proc.poll(now)
        if record is not None:
            self._on_exit(proc, record, now)
            return
        if proc.check_ready(now):
            log.info("%s: ready (%s)", proc.name, proc.spec.readiness.describe())  # type: ignore[union-attr]
        elif proc.ready_overdue(now):
            timeout = proc.spec.ready_timeout_s
            log.warning("%s: not ready after %gs; stopping it", proc.name, timeout)
            proc.handle(Event.READY_TIMEOUT, now, f"not ready after {timeout:g}s")

    def _on_exit(self, proc: SupervisedProcess, record: ExitRecord, now: float) -> None:
        facts = self._exit_facts(
            proc, record, shutting_down=self.status == SupervisorStatus.STOPPING
        )
        log.info("%s: %s after %.1fs", proc.name, record.describe(), facts.uptime_s)
        if proc.spec.run_id is not None:
            self._discovery_due = True  # a run ended: its directory may say why
            # Its writes cut short (a SIGKILL after its stop timeout), which no later
            # orchestrator of a finished or evicted run would remove.
            remove_killed_writes(self._run_path(proc))
        event = proc.exited(facts, now)
        if event == Event.EXIT_FAILED:
            log.error("%s: failed: %s", proc.name, proc.reason)
        elif event == Event.EXIT_BACKOFF:
            log.info("%s: %s", proc.name, proc.reason)

    def _exit_facts(
        self, proc: SupervisedProcess, record: ExitRecord, *, shutting_down: bool
    ) -> ExitFacts:
        # A shutdown decides the exit alone; the run directory need not be read.
        scan = None if shutting_down else self._run_scan(proc)
        return ExitFacts(
            description=record.describe(),
            clean=record.ok,
            code=record.code,
            uptime_s=_seconds_between(proc.started_at, record.time),
            shutting_down=shutting_down,
            run_hold=scan.hold_reason if scan else None,
            run_finished=scan.finished if scan else False,
            cause=record.cause,
        )

    def _start_due(self, now: float) -> None:
        for proc in list(self.processes.values()):
            if not proc.lifecycle.due(now):
                continue
            missing = [
                name
                for name in proc.spec.requires_ready
                if name not in self.processes or self.processes[name].state not in UP_STATES
            ]
            if missing:
                proc.handle(Event.BLOCKED, now, f"waiting for {', '.join(missing)} to be ready")
                continue
            record = proc.spawn(now)
            if record is not None:
                log.error("%s: cannot start: %s", proc.name, record.error)
            else:
                log.info("%s: started (pid %s)", proc.name, proc.pid)

    def _restart(self, proc: SupervisedProcess, now: float, why: str) -> None:
        log.info("%s: restarting (%s)", proc.name, why)
        proc.handle(Event.START, now, f"restarting: {why}")

    # -------------------------------------------------------------- runs

    def _run_path(self, proc: SupervisedProcess) -> Path:
        assert proc.spec.run_id is not None
        return layout.run_dir(self.experiment, proc.spec.run_id)

    def _run_scan(self, proc: SupervisedProcess) -> RunScan | None:
        """What the run directory of an orchestrator says; None for other processes."""
        if proc.spec.run_id is None:
            return None
        run = self._run_path(proc)
        if not run.is_dir():
            return RunScan(proc.spec.run_id, run, hold_reason=RUN_DELETED)
        return scan_run(run, self._validator)

    def _next_wait(self, now: float) -> float:
        """How long the loop sleeps: briefly while a new run waits for its orch.toml."""
        if any(now - since < AWAITING_FAST_S for since in self._awaiting_since.values()):
            return min(self.tick_s, AWAITING_TICK_S)
        return self.tick_s

    def _config_arrived(self) -> bool:
        """Whether a run that waits for its control/orch.toml (its directory came first,
        `RunScan.awaiting_config`) now says something else: looked at on every tick, as no
        event tells of files inside a run (see `discovery`). Few runs wait, and briefly."""
        return any(
            scan_run(scan.path, self._validator) != scan
            for scan in self._scans.values()
            if scan.awaiting_config
        )

    def _discover(self, now: float) -> None:
        self._discovery_due = False
        self._next_rescan = now + self.rescan_s
        if self.watcher is not None:
            self.watcher.sync()
        self._scans = scan_runs(self.experiment, self._validator)
        self._awaiting_since = {
            run_id: self._awaiting_since.get(run_id, now)
            for run_id, scan in self._scans.items()
            if scan.awaiting_config
        }
        views = {
            proc.spec.run_id: OrchestratorView(proc.state, proc.held, proc.reason)
            for proc in self.processes.values()
            if proc.spec.run_id is not None
        }
        for action in reconcile(self._scans, views):
            if isinstance(action, StartOrchestrator):
                self._start_orchestrator(action.run_id, action.path, now)
            elif isinstance(action, StopOrchestrator):
                proc = self.processes[action.run_id]
                if proc.has_os_process:
                    log.info("%s: stopping orchestrator: %s", action.run_id, action.reason)
                proc.handle(Event.HOLD, now, action.reason)

    def _start_orchestrator(self, run_id: str, run: Path, now: float) -> None:
        proc = self.processes.get(run_id)
        if proc is None:
            log.info("%s: discovered (%s)", run_id, run)
            proc = SupervisedProcess(self._orchestrator_spec(run_id, run))
            self.processes[run_id] = proc
        proc.handle(Event.START, now)

    def _orchestrator_spec(self, run_id: str, run: Path) -> ProcessSpec:
        try:
            return self.plan.orchestrator(run_id, run)
        except Exception as err:  # a broken plan fails one run, not the supervisor
            log.exception("%s: cannot build the orchestrator's command", run_id)
            problem = f"cannot build the orchestrator's command: {err}"
            return ProcessSpec(
                name=run_id,
                kind="orchestrator",
                run_id=run_id,
                argv=[],
                log_path=layout.orchestrator_log_path(run),
                preflight=lambda: problem,
            )

    def _stop_early(self, now: float) -> None:
        """Evict the runs early stopping gave up on; its faults never stall the loop."""
        if self.early_stopping is None:
            return
        try:
            evictions = self.early_stopping.poll(now)
            for eviction in evictions:
                if run_control.read_eviction(layout.run_dir(self.experiment, eviction.run_id)):
                    continue
                by = self.early_stopping.evicted_by
                self.evict_run(eviction.run_id, eviction.reason, by=by, now=now)
                self.early_stopping.evicted(eviction)
            if evictions:
                # PBT wrote a fork in the evicted run's place: know it before this tick asks
                # whether every run is done.
                self._discover(now)
        except Exception as err:
            self._log_fault(err)

    def _stop_when_done(self) -> None:
        fixed_failed = [
            name for name in self._fixed if self.processes[name].state == ProcessState.FAILED
        ]
        if fixed_failed:
            self.request_stop(f"giving up: {', '.join(fixed_failed)} failed")
            return
        for run_id, scan in self._scans.items():
            proc = self.processes.get(run_id)
            if proc is None:
                if scan.runnable:
                    return  # discovered, not started yet
                continue
            if proc.state not in TERMINAL_STATES:
                return
        orchestrators = [p for p in self.processes.values() if p.spec.run_id is not None]
        if any(p.state not in TERMINAL_STATES for p in orchestrators):
            return
        self.request_stop("every run is done")

    # -------------------------------------------------------------- control requests

    def _serve_requests(self, now: float) -> None:
        if self.control is None:
            return
        while not self.control.pending.empty():
            pending = self.control.pending.get_nowait()
            try:
                reply = self.handle_request(pending.request, now)
            except ControlError as err:
                reply = {"ok": False, "error": str(err)}
            except Exception as err:
                log.exception("control request %r failed", pending.request)
                reply = {"ok": False, "error": f"internal error: {err}"}
            pending.finish(reply)

    def handle_request(self, request: dict[str, Any], now: float) -> dict[str, Any]:
        """Carry out one control request; raises ControlError with a message for the user."""
        command = request.get("cmd")
        if command not in COMMANDS:
            raise ControlError(f"unknown command {command!r}; known: {', '.join(COMMANDS)}")
        if command == "ping":
            return {"ok": True, "pid": os.getpid(), "status": self.status}
        if command == "stop_all":
            self.request_stop("stop_all requested")
            return {"ok": True, "pid": os.getpid()}
        if self.status in SHUTDOWN_STATUSES:
            raise ControlError("the supervisor is stopping; start it again with `workbench up`")
        log.info("control: %s", json.dumps(request))
        if command == "evict":
            return self._evict(request, now)
        if command == "restart_run":
            return self._restart_run(_field(request, "run_id"), now)
        if command == "restart_process":
            return self._restart_process(_field(request, "name"), now)
        return self._add_run(request)

    def _existing_run(self, raw_id: str) -> tuple[str, Path]:
        run_id = normalize_run_id(raw_id.strip())
        run = layout.run_dir(self.experiment, run_id)
        if not run.is_dir():
            known = ", ".join(p.name for p in layout.list_run_dirs(self.experiment)) or "none"
            raise ControlError(f"no run {raw_id!r} in {self.experiment} (runs: {known})")
        return run_id, run

    def _evict(self, request: dict[str, Any], now: float) -> dict[str, Any]:
        run_id, _ = self._existing_run(_field(request, "run_id"))
        reason = str(request.get("reason") or "evicted by the user")
        already, stopping = self.evict_run(
            run_id, reason, by=str(request.get("by") or "user"), now=now
        )
        return {"ok": True, "run_id": run_id, "already_evicted": already, "stopped": stopping}

    def evict_run(self, run_id: str, reason: str, *, by: str, now: float) -> tuple[bool, bool]:
        """How the supervisor evicts, for early stopping and for the `evict` request (which
        the CLI and the TUI send through `client.evict_and_tell` once they have written
        the file): write `evicted.txt` (`run_control.evict`, unless there is one) and stop
        the run's orchestrator; the trainer frees its slot at its next discovery. Returns
        (already evicted, an orchestrator was stopping)."""
        eviction, already = run_control.evict(layout.run_dir(self.experiment, run_id), reason, by)
        if not already:
            log.info("%s: evicted by %s: %s", run_id, by, reason)
        proc = self.processes.get(run_id)
        stopping = proc is not None and proc.state not in TERMINAL_STATES
        if proc is not None:
            proc.handle(Event.HOLD, now, f"evicted: {eviction.reason}")
        self._discovery_due = True
        return already, stopping

    def _restart_run(self, raw_id: str, now: float) -> dict[str, Any]:
        run_id, run = self._existing_run(raw_id)
        cleared = run_control.clear_eviction(run)
        scan = scan_run(run, self._validator)
        if scan.hold_reason is not None:
            raise ControlError(
                f"{run_id} cannot run: {scan.hold_reason}; fix {layout.orch_config_path(run)}"
            )
        proc = self.processes.get(run_id)
        if proc is None:
            self._start_orchestrator(run_id, run, now)
        else:
            self._restart(proc, now, "eviction cleared" if cleared else "requested")
        self._discovery_due = True
        return {"ok": True, "run_id": run_id, "cleared_eviction": cleared}

    def _restart_process(self, name: str, now: float) -> dict[str, Any]:
        proc = self.processes.get(name) or self.processes.get(normalize_run_id(name))
        if proc is None:
            known = ", ".join(self.processes) or "none"
            raise ControlError(f"no process {name!r} (processes: {known})")
        scan = self._run_scan(proc)
        if scan is not None and scan.hold_reason is not None:
            raise ControlError(
                f"{proc.name} cannot run: {scan.hold_reason}; to clear an eviction use "
                f"`workbench restart {proc.name}` (restart_run)"
            )
        self._restart(proc, now, "requested")
        return {"ok": True, "name": proc.name}

    def _add_run(self, request: dict[str, Any]) -> dict[str, Any]:
        overrides = request.get("overrides") or {}
        if not isinstance(overrides, dict):
            raise ControlError("overrides must be a JSON object of orchestrator settings")
        run_id, config = new_run_config(self.experiment, _field(request, "run_id"), overrides)
        run = write_run(self.experiment, run_id, config)
        log.info("%s: added (%s)", run_id, run)
        self._discovery_due = True
        return {"ok": True, "run_id": run_id, "path": str(run)}

    # -------------------------------------------------------------- shutdown

    def _begin_shutdown(self) -> None:
        log.info("stopping: %s", self._stop_reason)
        self.status = SupervisorStatus.STOPPING
        orchestrators = [n for n, p in self.processes.items() if p.spec.run_id is not None]
        others = [n for n, p in self.processes.items() if p.spec.run_id is None]
        self._shutdown_stages = [orchestrators, *([name] for name in reversed(others))]

    def _advance_shutdown(self, now: float) -> None:
        while self._shutdown_stages:
            stage = self._shutdown_stages[0]
            for name in stage:
                self.processes[name].handle(
                    Event.STOP, now, f"supervisor stopping ({self._stop_reason})"
                )
            if any(self.processes[name].has_os_process for name in stage):
                return
            self._shutdown_stages.pop(0)
        self.status = SupervisorStatus.STOPPED

    def _emergency_stop(self) -> None:
        for proc in self.processes.values():
            proc.kill_now()
        deadline = time.monotonic() + 5
        while any(p.has_os_process for p in self.processes.values()) and (
            time.monotonic() < deadline
        ):
            for proc in self.processes.values():
                now = time.monotonic()
                record = proc.poll(now)
                if record is not None:
                    proc.exited(self._exit_facts(proc, record, shutting_down=True), now)
            time.sleep(0.05)
        self.status = SupervisorStatus.STOPPED

    # -------------------------------------------------------------- state.json

    def state_payload(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "experiment": str(self.experiment),
            "started_at": self.started_at,
            "status": self.status,
            "exit_when_done": self.exit_when_done,
            "stop_reason": self._stop_reason,
            "error": None,
            "warnings": self.tracking.warnings() if self.tracking is not None else [],
            "processes": {name: proc.to_json() for name, proc in self.processes.items()},
            "placement": self.plan.placement,
            "startup": self._startup_phase(),
        }

    def _startup_phase(self) -> dict[str, Any] | None:
        """What startup is doing (`workbench.supervisor.startup`); None once stopping."""
        if self.status in SHUTDOWN_STATUSES:
            return None
        facts = [
            ProcessFacts(
                name=proc.name,
                state=proc.state,
                started_at=proc.started_at,
                reason=proc.reason,
                log_path=proc.spec.log_path,
                ended_at=proc.exits[-1].time if proc.exits else None,
            )
            for proc in (self.processes[name] for name in self._fixed)
        ]
        return self.startup.observe(facts).to_json()

    def _publish_state(self) -> None:
        payload = self.state_payload()
        text = json.dumps(payload, sort_keys=True)
        now = time.monotonic()
        if text == self._last_state and now < self._state_written_at + STATE_HEARTBEAT_S:
            return
        write_state(self.experiment, payload)  # on failure, the next tick tries again
        self._last_state, self._state_written_at = text, now


def write_state(experiment: Path, payload: dict[str, Any]) -> None:
    payload = {**payload, "updated_at": now_iso()}
    layout.atomic_write_text(paths.state_path(experiment), json.dumps(payload, indent=2) + "\n")


def _field(request: dict[str, Any], name: str) -> str:
    value = request.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ControlError(f"request {request.get('cmd')!r} needs {name!r} (a non-empty string)")
    return value


def _seconds_between(start_iso: str | None, end_iso: str) -> float:
    start, end = unix_time(start_iso), unix_time(end_iso)
    return 0.0 if start is None or end is None else end - start


# ---------------------------------------------------------------- the daemon process


def run_daemon(experiment: Path, *, plan: str = DEFAULT_PLAN, exit_when_done: bool = False) -> int:
    """Body of `python -m workbench.supervisor`: lock, clean up, plan, supervise."""
    experiment = Path(experiment).resolve()
    supervisor_dir = layout.supervisor_dir(experiment)
    supervisor_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(supervisor_dir, 0o700)  # the socket, pid file and API key are the owner's alone
    _configure_logging()
    lock = SupervisorLock(experiment)
    try:
        lock.acquire()
    except AlreadyRunning as err:
        log.error("refusing to start: %s", err)
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_ALREADY_RUNNING
    base_state: dict[str, Any] = {
        "pid": os.getpid(),
        "experiment": str(experiment),
        "started_at": now_iso(),
        "exit_when_done": exit_when_done,
        "stop_reason": None,
        "processes": {},
    }
    try:
        leftovers = kill_leftovers(experiment, timeout_s=10.0)
        if leftovers:
            log.warning("stopped %d process(es) left by an earlier supervisor", len(leftovers))
        try:
            supervisor = Supervisor(
                experiment, load_plan_factory(plan)(experiment), exit_when_done=exit_when_done
            )
        except (PlanError, ConfigError) as err:
            log.error("cannot start: %s", err)
            write_state(
                experiment, {**base_state, "status": SupervisorStatus.STOPPED, "error": str(err)}
            )
            return EXIT_PLAN_FAILED
        except Exception as err:
            log.exception("cannot start: the plan %s failed", plan)
            message = f"the plan {plan} failed: {type(err).__name__}: {err}"
            write_state(
                experiment, {**base_state, "status": SupervisorStatus.STOPPED, "error": message}
            )
            return EXIT_PLAN_FAILED
        _install_signal_handlers(supervisor)
        return supervisor.run()
    finally:
        lock.release()


def _outside_handler(action) -> None:
    """Run `action` on a new thread. A signal handler runs on the main thread between two
    bytecodes, possibly while that thread holds the wake Event's lock (inside its set,
    clear or wait); setting the Event from the handler would then wait on that lock
    forever. Seen: the supervisor hung in Event.clear with a SIGCHLD handler inside."""
    threading.Thread(target=action, name="signal", daemon=True).start()


def _install_signal_handlers(supervisor: Supervisor) -> None:
    def stop(signum: int, _frame: object) -> None:
        reason = f"received {signal.Signals(signum).name}"
        _outside_handler(lambda: supervisor.request_stop(reason))

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # The daemon has no terminal; a hang-up must not kill it.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Wake the loop as soon as a child exits instead of at the next tick.
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: _outside_handler(supervisor.wake))


def _configure_logging() -> None:
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        force=True,
    )
