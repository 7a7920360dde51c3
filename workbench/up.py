"""`workbench up` in one flow: from a recipe file to a supervised, followed experiment.

    status = launch_experiment(recipe_file, Report(say=print, warn=print), headless=True)

1. `read_recipe`: parse and validate the recipe (`--max-steps` applied), then check what the
   processes will meet (`workbench.supervisor.preflight`: environments, the base model, prompt
   lengths, adapter slots, whether the slots fit in memory, `max_concurrent_runs = "auto"`
   sized: `workbench.supervisor.slots`); every problem names the file, line and key, and
   nothing is written (`RecipeError`).
2. Refuse an experiment whose supervisor already runs, naming its pid (`LaunchError`).
3. `create_experiment`: recipe.toml and one run_<id>/control/orch.toml per run.
4. `start_daemon`: the supervisor in its own session; it returns once the supervisor runs.
5. Hand the terminal to the TUI; or, headless, follow the experiment (one line per
   change) until every run is done and return its status (Ctrl-C or SIGTERM stops it); or,
   detached, return at once.

What happens is said through `report` as plain lines; the CLI only prints them.
`follow_experiment` serves `workbench attach` too, where no TUI can be shown.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomlkit
from tomlkit import TOMLDocument

from workbench.config import ConfigError, parse_toml
from workbench.experiment import create_experiment
from workbench.files import layout
from workbench.files.run_control import Condition
from workbench.recipe import Recipe, recipe_from_document
from workbench.status import read_experiment, run_statuses
from workbench.supervisor.client import (
    SupervisorClient,
    process_summaries,
    read_state,
    running_supervisor_pid,
)
from workbench.supervisor.launch import (
    SupervisorStartError,
    already_running_message,
    start_daemon,
    stop_experiment,
)
from workbench.supervisor.lifecycle import UP_STATES, ProcessState
from workbench.supervisor.preflight import check_recipe
from workbench.supervisor.slots import resolve_auto_slots, size_slots
from workbench.supervisor.startup import StartupPhase
from workbench.sweep.pbt_scheduler import EVICTED_BY as PBT_EVICTED_BY
from workbench.sweep.scheduler import EVICTED_BY
from workbench.system.signals import sigterm_as_interrupt

POLL_S = 0.5
# A startup phase that goes on (a long build, vLLM's start) is said again this often.
PHASE_EVERY_S = 10.0


class RecipeError(Exception):
    """The recipe cannot be read or is invalid; the message lists every problem."""


class LaunchError(Exception):
    """The experiment could not be started; the message says why and what to do."""


@dataclass(frozen=True)
class Report:
    """Where the flow says what happens: `say` for progress, `warn` for what went wrong."""

    say: Callable[[str], None]
    warn: Callable[[str], None]


def read_recipe(path: Path, max_steps: int | None = None) -> tuple[TOMLDocument, Recipe]:
    """The recipe's document (comments kept, for recipe.toml) and its model, checked as far
    as anything can be before its processes start."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{path}: file not found; check the path") from None
    except (IsADirectoryError, UnicodeDecodeError) as err:
        raise RecipeError(f"{path}: cannot read: {err}") from None
    try:
        document = parse_toml(text, path)
        if max_steps is not None:
            document.setdefault("defaults", {})["max_steps"] = max_steps
        recipe = recipe_from_document(document, path)
        sizing = resolve_auto_slots(recipe, document) or size_slots(recipe)
        check_recipe(recipe, path, tomlkit.dumps(document), sizing)
        recipe.slot_arithmetic = sizing.lines(recipe.trainer.max_concurrent_runs, recipe.max_loras)
        return document, recipe
    except ConfigError as err:
        raise RecipeError(f"invalid recipe\n{err}") from None


def launch_experiment(
    recipe_file: Path,
    report: Report,
    *,
    max_steps: int | None = None,
    headless: bool = False,
    detach: bool = False,
    load_tui: Callable[[], Callable[[Path], None] | None] = lambda: None,
) -> int:
    """Start an experiment from `recipe_file` and follow it as asked; the exit status.

    `load_tui` gives the TUI's entry point, or None where there is no TUI: the experiment
    is then followed headless. The status is 1 when headless and a run did not finish
    (early stopping aside), else 0.
    """
    document, recipe = read_recipe(recipe_file, max_steps)
    running = running_supervisor_pid(recipe.output_dir)
    if running is not None:
        raise LaunchError(already_running_message(recipe.output_dir, running))
    run_tui = None if headless or detach else load_tui()
    headless = headless or (run_tui is None and not detach)
    experiment = create_experiment(recipe, document)
    report.say(f"experiment {recipe.experiment.name} at {experiment}")
    for run_id in recipe.run_configs():
        report.say(f"  {run_id}: {layout.orch_config_path(layout.run_dir(experiment, run_id))}")
    try:
        started = start_daemon(experiment, exit_when_done=headless)
    except SupervisorStartError as err:
        raise LaunchError(str(err)) from None
    supervisor_log = layout.process_log_path(experiment, "supervisor")
    report.say(f"supervisor started (pid {started.pid}), log: {supervisor_log}")
    if detach:
        report_still_running(experiment, report)
        return 0
    if headless:
        # Under a batch scheduler, `scancel` (or `kill`) stops the experiment as Ctrl-C does.
        with sigterm_as_interrupt():
            return follow_experiment(
                experiment, report, ctrl_c_stops=True, supervisor=started.process
            )
    assert run_tui is not None
    run_tui(experiment)
    report_still_running(experiment, report)
    return 0


def report_still_running(experiment: Path, report: Report) -> None:
    """Say how to reach an experiment whose supervisor runs on in the background."""
    if running_supervisor_pid(experiment) is None:
        return
    report.say(
        "the experiment keeps running in the background:\n"
        f"  workbench attach {experiment}        reopen the TUI\n"
        f"  workbench status {experiment}        runs and processes\n"
        f"  workbench logs supervisor -e {experiment}\n"
        f"  workbench down {experiment}          stop everything"
    )


# ---------------------------------------------------------------- following (headless)


def follow_experiment(
    experiment: Path,
    report: Report,
    *,
    ctrl_c_stops: bool,
    supervisor: subprocess.Popen[bytes] | None = None,
) -> int:
    """Say one line per change until the supervisor exits; return the headless status.

    Ctrl-C stops the experiment when `ctrl_c_stops` (a second Ctrl-C leaves it running),
    else it only stops following.
    """
    client = SupervisorClient(experiment)
    previous: Snapshot | None = None

    def say_changes() -> None:
        nonlocal previous
        current = snapshot(experiment)
        for line in describe_changes(previous, current):
            report.say(f"{time.strftime('%H:%M:%S')} {line}")
        previous = current

    try:
        while True:
            say_changes()
            if not client.is_running():
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        if not ctrl_c_stops:
            report_still_running(experiment, report)
            return 0
        report.say("stopping the experiment (Ctrl-C again leaves it running)...")
        try:
            stop_experiment(experiment)
        except KeyboardInterrupt:
            report_still_running(experiment, report)
            return 1
    if supervisor is not None:
        supervisor.wait()
    say_changes()
    return _report_outcome(experiment, report)


def _report_outcome(experiment: Path, report: Report) -> int:
    runs = run_statuses(experiment)
    # A run early stopping gave up on, or one PBT replaced by a fork, is an outcome of the
    # sweep, not a failure.
    by_sweep = (EVICTED_BY, PBT_EVICTED_BY)
    stopped_early = [r for r in runs if r.status == Condition.EVICTED and r.evicted_by in by_sweep]
    unfinished = [r for r in runs if r.status != Condition.FINISHED and r not in stopped_early]
    if not unfinished:
        finished = len(runs) - len(stopped_early)
        by = "/".join(sorted({r.evicted_by for r in stopped_early if r.evicted_by}))
        early = f", {len(stopped_early)} stopped early by {by}" if stopped_early else ""
        report.say(f"every run finished ({finished}{early})")
        return 0
    for run in unfinished:
        said = run.status
        if run.reason:
            why = run.reason.splitlines()[0]
            # A divergence's reason starts with its status: `diverged: gradient norm nan ...`.
            said = why if why.startswith(f"{run.status}:") else f"{said}: {why}"
        report.warn(f"{run.id} did not finish ({said})")
    for row in process_summaries(read_state(experiment) or {}, live=False):
        if row["state"] == ProcessState.FAILED:
            report.warn(f"{row['name']} failed: {row['reason'] or row['last_exit']}")
    return 1


@dataclass(frozen=True)
class Snapshot:
    """What headless following reports on: process states, run statuses, and the startup
    phase (`workbench.supervisor.startup`) at unix time `now`."""

    processes: dict[str, tuple[str, str | None]]
    runs: dict[str, tuple[str, int, int | None, str | None]]
    startup: StartupPhase | None = None
    now: float = 0.0


def snapshot(experiment: Path) -> Snapshot:
    read = read_experiment(experiment)
    state = read.supervisor_state or {}
    # An orchestrator's process name is its run id: say which of the two a line is about.
    processes = {
        (f"orchestrator {name}" if record.get("run_id") else name): (
            str(record.get("state")),
            record.get("reason"),
        )
        for name, record in (state.get("processes") or {}).items()
        if isinstance(record, dict)
    }
    runs = {run.id: (run.status, run.step, run.max_steps, run.reason) for run in read.runs}
    return Snapshot(processes, runs, read.last_startup, read.now)


def _phase_mark(snap: Snapshot) -> tuple | None:
    """What must change for following to say the startup phase again."""
    phase = snap.startup
    if phase is None:
        return None
    if phase.ready:
        return (phase.phase, phase.since)
    # A new log line or loss is no news; a new step, a restart (a new `since`) or ten
    # more seconds are.
    repeat = int((phase.elapsed_s(snap.now) or 0.0) // PHASE_EVERY_S)
    return (phase.phase, phase.process, phase.since, phase.step, repeat)


def describe_changes(before: Snapshot | None, after: Snapshot) -> list[str]:
    """One line per process state change, run status change or run step; the startup
    phase when it changes, its step does, or every `PHASE_EVERY_S` while it lasts."""
    before = before or Snapshot({}, {})
    lines = []
    for name, (state, reason) in after.processes.items():
        old = before.processes.get(name)
        if old is not None and old[0] == state:
            continue
        arrow = f"{old[0]} -> {state}" if old is not None else state
        note = f" ({reason})" if reason and state not in UP_STATES else ""
        lines.append(f"{name}: {arrow}{note}")
    for run_id, (status, step, max_steps, reason) in after.runs.items():
        old_run = before.runs.get(run_id)
        progress = f"step {step}/{max_steps}" if max_steps else f"step {step}"
        if old_run is None or old_run[0] != status:
            note = f": {reason.splitlines()[0]}" if reason else ""
            lines.append(f"{run_id}: {status}, {progress}{note}")
        elif old_run[1] != step:
            lines.append(f"{run_id}: {progress}")
    if after.startup is not None and _phase_mark(after) != _phase_mark(before):
        lines.append(after.startup.describe(after.now))
    return lines
