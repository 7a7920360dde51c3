"""The startup phase: worked out from the fixed processes, a model build and a log's last
line; put into words from what state.json holds."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from workbench.files import layout
from workbench.models.build_progress import BuildProgress, BuildProgressFile
from workbench.supervisor.startup import (
    LAST_LINE_CHARS,
    ProcessFacts,
    StartupPhase,
    StartupTracker,
    last_log_line,
    phase_of,
    startup_phase,
)

NOW = 1_790_000_000.0


def iso(seconds_before_now: float) -> str:
    return dt.datetime.fromtimestamp(NOW - seconds_before_now, tz=dt.UTC).isoformat()


def facts(name: str, state: str, **fields) -> ProcessFacts:
    fields.setdefault("started_at", iso(43))
    fields.setdefault("reason", None)
    fields.setdefault("log_path", Path(f"/logs/{name}.log"))
    return ProcessFacts(name=name, state=state, **fields)


def no_log(path: Path) -> str | None:
    return None


# ---------------------------------------------------------------- the words


def test_a_build_says_its_step_what_it_does_and_how_long_it_has_taken():
    state = {
        "startup": {
            "phase": "building model",
            "since": iso(12),
            "step": 2,
            "steps": 3,
            "detail": "warm-up update 40 of 150 (loss 0.520)",
            "model": "builtin:tiny-reverse",
        }
    }
    assert startup_phase(state).describe(NOW) == (
        "building model builtin:tiny-reverse: step 2/3, warm-up update 40 of 150 (loss 0.520), 12s"
    )


def test_a_build_waiting_for_another_process_says_so():
    waiting = StartupPhase(
        "building model",
        since=iso(5),
        detail="waiting for another process's build",
        model="builtin:tiny-reverse",
    )
    assert waiting.describe(NOW) == (
        "building model builtin:tiny-reverse: waiting for another process's build, 5s"
    )


def test_a_starting_process_says_how_long_it_has_taken_and_its_last_log_line():
    state = {
        "startup": {
            "phase": "starting",
            "since": iso(43),
            "process": "inference",
            "last_line": "INFO Started server process [4321]",
        }
    }
    assert startup_phase(state).describe(NOW) == (
        "starting inference: 43s, last line: INFO Started server process [4321]"
    )


def test_a_process_waiting_to_restart_says_why_instead_of_a_time():
    phase = StartupPhase(
        "starting",
        since=iso(3),
        process="inference",
        detail="exit code 1; restart 1 of 3 in 2.0s",
        last_line="error: not enough memory",
    )
    assert phase.describe(NOW) == (
        "starting inference: exit code 1; restart 1 of 3 in 2.0s; "
        "last line: error: not enough memory"
    )


def test_failed_and_ready_phases():
    failed = StartupPhase("failed", process="inference", detail="gave up after 3 restarts")
    assert failed.describe(NOW) == "inference failed: gave up after 3 restarts"
    ready = StartupPhase("ready", since=iso(0), detail="up after 52s")
    assert ready.ready and ready.describe(NOW) == "ready: up after 52s"


def test_a_state_without_a_phase_or_with_a_malformed_one_has_none():
    assert startup_phase(None) is None
    assert startup_phase({"status": "running"}) is None  # an older supervisor
    assert startup_phase({"startup": {"phase": "dancing"}}) is None
    assert startup_phase({"startup": {"phase": "starting", "process": 3}}) is None
    odd = startup_phase({"startup": {"phase": "starting", "process": "inference", "step": "2"}})
    assert odd == StartupPhase("starting", process="inference")
    assert odd.describe(NOW) == "starting inference: -"


# ---------------------------------------------------------------- working it out


def test_a_build_in_progress_comes_before_the_process_that_builds():
    build = BuildProgress("builtin:tiny-reverse", 2, 3, "warm-up", iso(9), pid=1)
    phase = phase_of([facts("inference", "starting"), facts("trainer", "running")], build, no_log)
    assert (phase.phase, phase.step, phase.steps, phase.since) == ("building model", 2, 3, iso(9))
    waiting = BuildProgress("builtin:tiny-reverse", 0, 0, "waiting", iso(9), pid=1)
    phase = phase_of([facts("inference", "starting")], waiting, no_log)
    assert (phase.step, phase.steps) == (None, None)


def test_the_first_process_not_up_in_start_order_is_the_phase():
    lines = {Path("/logs/inference.log"): "loading", Path("/logs/trainer.log"): "rank0 up"}
    processes = [
        facts("inference", "starting", reason="restarting: requested"),
        facts("trainer", "running"),
    ]
    phase = phase_of(processes, None, lines.get)
    # A spawned process's reason is the one from before it started: not shown.
    assert phase == StartupPhase(
        "starting", since=iso(43), process="inference", last_line="loading"
    )
    processes = [
        facts("inference", "ready"),
        facts("trainer", "backoff", ended_at=iso(1), reason="exit code 1; restart"),
    ]
    phase = phase_of(processes, None, lines.get)
    assert (phase.process, phase.since, phase.detail) == ("trainer", iso(1), "exit code 1; restart")
    failed = phase_of([facts("inference", "failed", reason="gave up")], None, lines.get)
    assert failed == StartupPhase("failed", process="inference", detail="gave up")
    assert (
        phase_of([facts("inference", "ready"), facts("trainer", "running")], None, no_log) is None
    )


def test_the_last_log_line_skips_blank_lines_escape_codes_and_old_redraws(tmp_path: Path):
    log = tmp_path / "inference.log"
    log.write_text("first\n\x1b[32mINFO\x1b[0m loading\rINFO loaded 100%\n   \n\n")
    assert last_log_line(log) == "INFO loaded 100%"
    log.write_text("x" * 500 + "\n")
    line = last_log_line(log)
    assert len(line) == LAST_LINE_CHARS and line.endswith("...")
    assert last_log_line(tmp_path / "missing.log") is None


def test_the_tracker_follows_a_live_build_ignores_a_dead_one_and_times_readiness(
    tmp_path: Path,
):
    tracker = StartupTracker(tmp_path, began_at=iso(0))
    starting = [facts("inference", "starting", log_path=tmp_path / "inference.log")]
    with BuildProgressFile(tmp_path, "builtin:tiny-reverse") as on_step:
        on_step(1, 3, "initial weights from seed 0")
        assert tracker.observe(starting).phase == "building model"
        # A build killed mid-way leaves its file with a pid that no longer runs.
        path = layout.model_build_path(tmp_path)
        path.write_text(path.read_text().replace(str(os.getpid()), str(2**22 + 1)))
        assert tracker.observe(starting).process == "inference"
    assert not path.exists(), "a finished build removes its progress file"
    ready = tracker.observe([facts("inference", "ready")])
    assert ready.ready and ready.detail.startswith("up after ")
    assert tracker.observe([facts("inference", "ready")]) == ready  # said once, kept
    assert tracker.observe(starting).phase == "starting"
    assert tracker.observe([facts("inference", "ready")]).since >= ready.since
