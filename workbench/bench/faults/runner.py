"""Run the fault scenarios one after the other, each on a fresh experiment, and report.

For each scenario: `up`, wait for the moment drawn from the seed, inject, wait until the
runs expected to finish have finished (or the scenario's time is up), `down`, then the
checks:

- completed: runs expected to finish that did (a deleted run is not expected to);
- recomputed: the most trainer steps any run trained twice; at most one checkpoint
  interval (a restart goes back to the latest checkpoint and trains its steps again);
- incomplete loaded: checkpoints the trainer resumed from that lacked STABLE (must be 0),
  and for forced restarts whether every run resumed from its latest checkpoint;
- half-written: temp files, staged directories and step directories without STABLE left
  in the experiment (must be 0);
- orphans: processes of the experiment alive after `down` (must be 0);
- recover: the longest pause in any run's generation or training after the injection.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from pathlib import Path
from random import Random
from typing import Any

from workbench.bench.faults import invariants
from workbench.bench.faults.experiment import RUN_IDS, FaultExperiment
from workbench.bench.faults.scenarios import BY_NAME, QUICK, SCENARIOS, Injection, Scenario
from workbench.bench.results import write_result
from workbench.files import layout
from workbench.files.metrics import read_metrics

FULL = {"max_steps": 16, "checkpoint_interval": 4}
QUICK_SIZE = {"max_steps": 10, "checkpoint_interval": 3}
SCENARIO_TIMEOUT_S = 900.0


def run_faults_benchmark(
    *,
    seed: int = 0,
    quick: bool = False,
    only: list[str] | None = None,
    keep_outputs: bool = False,
) -> dict[str, Any]:
    names = only or (list(QUICK) if quick else [s.name for s in SCENARIOS])
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; known: {', '.join(BY_NAME)}")
    size = QUICK_SIZE if quick else FULL
    results = []
    for name in names:
        scratch = Path(tempfile.mkdtemp(prefix=f"workbench-faults-{name}-"))
        started = time.monotonic()
        load = os.getloadavg()[0]
        try:
            record = run_scenario(BY_NAME[name], scratch, Random(f"{seed}:{name}"), **size)
        finally:
            if not keep_outputs:
                shutil.rmtree(scratch, ignore_errors=True)
        record["wall_s"] = round(time.monotonic() - started, 1)
        record["load_at_start"] = round(load, 2)
        if keep_outputs:
            record["scratch"] = str(scratch)
        results.append(record)
        print(format_row(record), flush=True)
    payload = {"seed": seed, "quick": quick, **size, "scenarios": results}
    # A selection is reported apart: it must not pass for the whole benchmark.
    name = "faults-selected" if only else ("faults-quick" if quick else "faults")
    path = write_result(name, payload)
    return {**payload, "path": str(path)}


def run_scenario(
    scenario: Scenario, scratch: Path, rng: Random, *, max_steps: int, checkpoint_interval: int
) -> dict[str, Any]:
    exp = FaultExperiment(scratch, max_steps, checkpoint_interval)
    inj = Injection(exp, rng)
    try:
        if scenario.setup:
            scenario.setup(inj)
        result = exp.up()
        if result.returncode != 0:
            inj.notes.append(f"up failed: {(result.stdout + result.stderr).strip()[-400:]}")
        try:
            inject_at_its_moment(scenario, inj, max_steps)
        except Exception as err:  # a broken injection is a row of the report, not the end
            inj.notes.append(f"injection failed: {type(err).__name__}: {err}")
        done = exp.wait_until_done(inj.expect_finished, SCENARIO_TIMEOUT_S)
        if not done:
            inj.notes.append(f"runs not done after {SCENARIO_TIMEOUT_S:g}s")
        exp.record_processes()
        down = exp.down()
        if down.returncode != 0:
            inj.notes.append(f"down: exit {down.returncode}")
        return check(scenario, inj, exp.alive())
    finally:
        exp.kill_leftovers()
        if scenario.teardown:
            scenario.teardown(inj)


def inject_at_its_moment(scenario: Scenario, inj: Injection, max_steps: int) -> None:
    if scenario.at_start:
        scenario.inject(inj)
        return
    exp = inj.exp
    target = inj.rng.randint(2, max_steps - 3)
    reached = exp.wait(lambda: exp.trained_step("run_a") >= target, 600, 0.05)
    time.sleep(inj.rng.uniform(0.0, 1.0))
    if reached:
        scenario.inject(inj)
    else:
        inj.notes.append(f"run_a never reached step {target}; nothing injected")


def check(scenario: Scenario, inj: Injection, orphans: list) -> dict[str, Any]:
    exp = inj.exp
    runs = [exp.path / run for run in RUN_IDS if (exp.path / run).is_dir()]
    completed = [run for run in inj.expect_finished if exp.finished(run)]
    recomputed = max((invariants.recomputed_steps(run) for run in runs), default=0)
    loaded = invariants.checkpoints_loaded(exp.path)
    incomplete = invariants.incomplete_loaded(exp.path, inj.planted)
    half = invariants.half_written(exp.path, inj.planted) if exp.path.is_dir() else []
    resumed_wrong = _resumed_wrong(inj, loaded)
    record = {
        "scenario": scenario.name,
        "fault": scenario.what,
        "injected": inj.injected,
        "expected_runs": len(inj.expect_finished),
        "completed": len(completed),
        "recomputed_steps_max": recomputed,
        "checkpoint_interval": exp.checkpoint_interval,
        "checkpoints_loaded": len(loaded),
        "incomplete_loaded": len(incomplete),
        "resumed_not_from_latest": resumed_wrong,
        "half_written": [str(path.relative_to(exp.path)) for path in half],
        "orphans": [f"{seen.pid} {seen.command}" for seen in orphans],
        "injected_at": inj.at,
        "recover_s": recovery_s(inj),
        "deleted_run_recreated": any((exp.path / run).exists() for run in inj.deleted),
        "notes": inj.notes + exp.cli_lines[-6:],
        **{k: v for k, v in inj.extra.items() if isinstance(v, int | float | bool | None)},
    }
    record["ok"] = (
        inj.injected > 0
        and record["completed"] == record["expected_runs"]
        and recomputed <= exp.checkpoint_interval
        and not incomplete
        and not resumed_wrong
        and not half
        and not orphans
        and not record["deleted_run_recreated"]
        and not inj.extra.get("security_problems")
        # A killed supervisor's children must stop by themselves (they die with it).
        and not ("children_gone_s" in inj.extra and inj.extra["children_gone_s"] is None)
    )
    return record


def _resumed_wrong(inj: Injection, loaded: list[tuple[str, Path]]) -> list[str]:
    """Runs a forced restart did not resume from the checkpoint that was latest then."""
    wrong = []
    for run_id, step in inj.resume_from.items():
        if step == 0:
            continue
        expected = layout.checkpoint_part_dir(inj.exp.path / run_id, step, "trainer")
        if not any(rid == run_id and path == expected for rid, path in loaded):
            wrong.append(f"{run_id}: expected {expected.parent.name}")
    return wrong


def recovery_s(inj: Injection, window_s: float = 300.0) -> float | None:
    """The longest pause in a run's generation or training (metrics.jsonl times) from its
    last record before the injection to `window_s` after it: how long the fault stopped
    work. Without a fault, steps come about a second apart."""
    if inj.at is None:
        return None
    pauses = []
    for run_id in inj.expect_finished:
        records = read_metrics(inj.exp.path / run_id)
        for source in ("orchestrator", "trainer"):
            times = sorted(m["time"] for m in records if m.get("source") == source)
            before = [t for t in times if t <= inj.at]
            window = [t for t in times if inj.at < t <= inj.at + window_s]
            if not window:
                continue
            points = [before[-1] if before else inj.at, *window]
            pauses.append(max(b - a for a, b in itertools.pairwise(points)))
    return round(max(pauses), 1) if pauses else None


COLUMNS = (
    ("scenario", 22),
    ("injected", 8),
    ("completed", 9),
    ("recomputed", 10),
    ("incomplete", 10),
    ("half-written", 12),
    ("orphans", 7),
    ("recover s", 9),
    ("ok", 3),
)


def format_row(record: dict[str, Any]) -> str:
    values = (
        record["scenario"],
        record["injected"],
        f"{record['completed']}/{record['expected_runs']}",
        f"{record['recomputed_steps_max']} (<= {record['checkpoint_interval']})",
        record["incomplete_loaded"],
        len(record["half_written"]),
        len(record["orphans"]),
        "-" if record["recover_s"] is None else record["recover_s"],
        "yes" if record["ok"] else "NO",
    )
    return "  ".join(str(v).ljust(width) for v, (_, width) in zip(values, COLUMNS, strict=True))


def format_table(report: dict[str, Any]) -> str:
    header = "  ".join(name.ljust(width) for name, width in COLUMNS)
    lines = [header, *(format_row(r) for r in report["scenarios"])]
    for record in report["scenarios"]:
        if not record["ok"] or record["notes"]:
            lines.append(f"{record['scenario']}: " + "; ".join(record["notes"][:4]))
    return "\n".join(lines)
