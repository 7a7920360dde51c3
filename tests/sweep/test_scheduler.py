"""The supervisor's early-stopping component on a real experiment directory: it follows
metrics.jsonl as it grows, writes every decision to sweep/asha.json before acting, and a
new instance (a restarted supervisor) stands by what was decided."""

from __future__ import annotations

import json
import os
from pathlib import Path

from workbench.config import OrchestratorConfig
from workbench.experiment import write_run
from workbench.files import layout, run_control
from workbench.sweep.files import read_asha
from workbench.sweep.scheduler import EarlyStopping
from workbench.sweep.spec import AshaSpec

SPEC = AshaSpec(grace_steps=5, reduction_factor=2, metric="eval_reward_mean", min_runs=3)
TICK = 10.0  # past the poll interval, so every poll reads


def add_run(experiment: Path, run_id: str, max_steps: int = 40) -> Path:
    return write_run(experiment, run_id, OrchestratorConfig(max_steps=max_steps))


def record(run: Path, step: int, value: float, at: float, *, source: str = "eval") -> None:
    line = {"source": source, "step": step, "time": at, "eval_reward_mean": value}
    with open(layout.metrics_path(run), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def three_runs_at_rung_zero(experiment: Path) -> dict[str, Path]:
    runs = {name: add_run(experiment, name) for name in ("run_a", "run_b", "run_c")}
    record(runs["run_a"], 5, 0.6, at=1.0)
    record(runs["run_b"], 5, 0.5, at=2.0)
    record(runs["run_c"], 5, 0.2, at=3.0)
    return runs


def test_a_run_that_falls_behind_is_handed_back_with_the_documented_reason(experiment: Path):
    three_runs_at_rung_zero(experiment)
    scheduler = EarlyStopping(experiment, SPEC)
    [eviction] = scheduler.poll(TICK)
    assert eviction.run_id == "run_c"
    assert eviction.reason == ("asha rung 0 (step 5): eval_reward_mean 0.2 < cutoff 0.5, rank 3/3")
    saved = read_asha(experiment)
    assert saved is not None and saved.spec == SPEC
    assert [(r.run_id, r.decision) for r in saved.results] == [
        ("run_a", "too_few"),
        ("run_b", "too_few"),
        ("run_c", "stop"),
        ("run_a", "continue"),  # the first two, judged once three runs reached the rung
        ("run_b", "continue"),
    ]
    assert saved.actions == {}, "decided and written down, not carried out yet"
    scheduler.evicted(eviction)
    assert read_asha(experiment).actions == {("run_c", 0): "evicted"}  # type: ignore[union-attr]


def test_a_restarted_supervisor_keeps_the_decisions_and_decides_nothing_twice(experiment: Path):
    runs = three_runs_at_rung_zero(experiment)
    first = EarlyStopping(experiment, SPEC)
    [eviction] = first.poll(TICK)
    first.evicted(eviction)
    run_control.write_eviction(runs["run_c"], eviction.reason, by="asha")
    before = layout.asha_state_path(experiment).read_text()

    again = EarlyStopping(experiment, SPEC)
    assert again.poll(TICK) == []
    decided = [r.decision for r in again.record.results]
    assert decided == ["too_few", "too_few", "stop", "continue", "continue"]
    assert layout.asha_state_path(experiment).read_text() == before


def test_a_stop_decided_but_not_carried_out_is_carried_out_after_a_restart(experiment: Path):
    three_runs_at_rung_zero(experiment)
    EarlyStopping(experiment, SPEC).poll(TICK)  # the supervisor died before evicting
    [eviction] = EarlyStopping(experiment, SPEC).poll(TICK)
    assert eviction.run_id == "run_c"


def test_a_run_whose_stop_is_not_carried_out_yet_is_not_judged_further(experiment: Path):
    runs = three_runs_at_rung_zero(experiment)
    scheduler = EarlyStopping(experiment, SPEC)
    [eviction] = scheduler.poll(TICK)
    for at, (name, value) in enumerate((("run_a", 0.7), ("run_b", 0.6), ("run_c", 0.9))):
        record(runs[name], 10, value, at=10.0 + at)
    assert scheduler.poll(2 * TICK) == [eviction], "still to be carried out"
    assert [(r.run_id, r.rung) for r in scheduler.record.results[5:]] == [
        ("run_a", 1),
        ("run_b", 1),
    ]


def test_metrics_are_read_as_they_grow_and_half_written_lines_wait(experiment: Path):
    runs = three_runs_at_rung_zero(experiment)
    run_d = add_run(experiment, "run_d")
    scheduler = EarlyStopping(experiment, SPEC)
    [first] = scheduler.poll(TICK)
    scheduler.evicted(first)
    line = json.dumps({"source": "eval", "step": 5, "time": 4.0, "eval_reward_mean": 0.1})
    with open(layout.metrics_path(run_d), "a", encoding="utf-8") as handle:
        handle.write(line[:20])
    assert scheduler.poll(2 * TICK) == [], "half a line is not a record yet"
    with open(layout.metrics_path(run_d), "a", encoding="utf-8") as handle:
        handle.write(line[20:] + "\n")
    [eviction] = scheduler.poll(3 * TICK)
    assert eviction.run_id == "run_d" and "rank 4/4" in eviction.reason
    scheduler.evicted(eviction)
    record(runs["run_a"], 10, 0.7, at=5.0)
    assert [r.run_id for r in scheduler.poll(4 * TICK)] == []
    assert scheduler.record.results[-1].run_id == "run_a"
    assert scheduler.record.results[-1].rung == 1


def test_polls_closer_than_the_interval_read_nothing(experiment: Path):
    three_runs_at_rung_zero(experiment)
    scheduler = EarlyStopping(experiment, SPEC, interval_s=1.0)
    scheduler.poll(100.0)
    assert scheduler.record.results
    record(layout.run_dir(experiment, "run_a"), 10, 0.9, at=9.0)
    scheduler.poll(100.5)
    assert len(scheduler.record.results) == 5
    scheduler.poll(101.0)
    assert len(scheduler.record.results) == 6


def test_a_run_already_evicted_by_hand_is_not_evicted_again(experiment: Path):
    runs = three_runs_at_rung_zero(experiment)
    run_control.write_eviction(runs["run_c"], "looked wrong", by="user")
    scheduler = EarlyStopping(experiment, SPEC)
    assert scheduler.poll(TICK) == []
    assert scheduler.record.actions == {("run_c", 0): "already evicted"}
    assert run_control.read_eviction(runs["run_c"]).reason == "looked wrong"  # type: ignore[union-attr]


def test_other_records_and_other_metrics_are_ignored(experiment: Path):
    run = add_run(experiment, "run_a")
    with open(layout.metrics_path(run), "a", encoding="utf-8") as handle:
        handle.write("not json\n")
        handle.write(json.dumps({"source": "trainer", "step": 9, "loss": 1.0}) + "\n")
        handle.write(json.dumps({"source": "eval", "step": "x", "eval_reward_mean": 1}) + "\n")
    scheduler = EarlyStopping(experiment, SPEC)
    assert scheduler.poll(TICK) == [] and scheduler.record.results == []


def test_the_orchestrators_reward_mean_can_be_the_metric(experiment: Path):
    spec = SPEC.model_copy(update={"metric": "reward_mean", "min_runs": 2})
    runs = [add_run(experiment, name) for name in ("run_a", "run_b")]
    for at, (run, reward) in enumerate(zip(runs, (0.8, 0.3), strict=True)):
        line = {"source": "orchestrator", "step": 5, "time": float(at), "reward_mean": reward}
        with open(layout.metrics_path(run), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
    [eviction] = EarlyStopping(experiment, spec).poll(TICK)
    assert eviction.reason == "asha rung 0 (step 5): reward_mean 0.3 < cutoff 0.55, rank 2/2"


def test_changed_settings_set_earlier_decisions_aside(experiment: Path):
    three_runs_at_rung_zero(experiment)
    EarlyStopping(experiment, SPEC).poll(TICK)
    changed = SPEC.model_copy(update={"min_runs": 10})
    scheduler = EarlyStopping(experiment, changed)
    assert scheduler.record.results == []
    assert scheduler.poll(TICK) == []
    assert {r.decision for r in scheduler.record.results} == {"too_few"}


def test_a_metrics_file_that_is_replaced_or_truncated_is_read_again_from_its_start(
    experiment: Path,
):
    run = add_run(experiment, "run_a")
    record(run, 3, 0.9, at=1.0)
    scheduler = EarlyStopping(experiment, SPEC)
    scheduler.poll(TICK)
    replacement = run / "metrics.jsonl.new"
    replacement.write_text(json.dumps({"step": 2, "time": 2.0, "eval_reward_mean": 0.1}) + "\n")
    os.replace(replacement, layout.metrics_path(run))  # the run directory came back anew
    scheduler.poll(2 * TICK)
    followed = scheduler._runs["run_a"]
    assert [(p.step, p.value) for p in followed.points] == [(2, 0.1)]
    layout.metrics_path(run).write_text("")  # truncated
    record(run, 1, 0.3, at=3.0)
    scheduler.poll(3 * TICK)
    assert [(p.step, p.value) for p in followed.points] == [(1, 0.3)]


def test_a_run_the_trainer_found_diverged_is_placed_last_at_its_next_rung(experiment: Path):
    from workbench.status import run_statuses
    from workbench.system.clock import unix_time

    runs = {name: add_run(experiment, name) for name in ("run_a", "run_b", "run_x")}
    record(runs["run_x"], 0, 0.3, at=0.5)
    why = "diverged: gradient norm nan at updates 3-5; try a lower lr in a new run"
    eviction = run_control.write_eviction(runs["run_x"], why, by="trainer")
    record(runs["run_a"], 5, 0.6, at=unix_time(eviction.evicted_at) + 1)
    record(runs["run_b"], 5, 0.4, at=unix_time(eviction.evicted_at) + 2)
    scheduler = EarlyStopping(experiment, SPEC)
    assert scheduler.poll(TICK) == [], "nothing to evict: it is out already"
    saved = read_asha(experiment)
    assert saved is not None
    assert [(r.run_id, r.rung, r.decision) for r in saved.results] == [
        ("run_x", 0, "diverged"),
        ("run_a", 0, "too_few"),
        ("run_b", 0, "continue"),  # three runs at the rung, one of them the diverged one
        ("run_a", 0, "continue"),
    ]
    assert saved.results[0].reached_at == unix_time(eviction.evicted_at)
    assert saved.actions == {}
    standing = {status.id: status.asha for status in run_statuses(experiment)}
    assert standing["run_x"] is not None
    assert standing["run_x"]["decision"] == "diverged" and standing["run_x"]["rung"] == 0
    assert standing["run_x"]["value"] is None and standing["run_x"]["rank"] is None
    assert EarlyStopping(experiment, SPEC).poll(TICK) == []
    again = read_asha(experiment)
    assert again is not None and len(again.results) == 4, "a restarted supervisor adds nothing"
