"""`workbench bench load`: its recipe, its choice of eviction, its checks on hand-built
experiment files, its key-to-screen timing on the real TUI, and one short real load."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import time
from pathlib import Path
from random import Random

import pytest

from tests.helpers import make_run
from tests.tui.synthetic import build_experiment
from workbench.bench.load import checks
from workbench.bench.load import keys as load_keys
from workbench.bench.load.background import BackgroundLoad
from workbench.bench.load.churn import SLOTS, choose_eviction, load_recipe
from workbench.bench.load.keys import TUI_SIZE, FrameTimedApp, press_keys, wait_for_runs
from workbench.bench.load.runner import run_load_benchmark
from workbench.bench.load.stalls import StallMeter
from workbench.files.metrics import append_metrics
from workbench.recipe import load_recipe as parse_recipe
from workbench.status import RunStatus

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "recipes" / "reverse_text.toml"


def test_the_load_recipe_is_the_shipped_one_with_16_short_runs_on_4_slots(tmp_path: Path):
    path = tmp_path / "load.toml"
    path.write_text(load_recipe(SHIPPED))
    shipped, load = parse_recipe(SHIPPED), parse_recipe(path)
    assert load.model == shipped.model
    assert load.trainer.max_concurrent_runs == SLOTS == 4
    configs = load.run_configs()
    assert len(configs) == 16
    assert {config.max_steps for config in configs.values()} == {8}
    assert {config.env for config in configs.values()} == {shipped.defaults.env}


def test_a_larger_load_has_its_runs_and_slots_and_vllm_adapters_for_every_slot(tmp_path: Path):
    path = tmp_path / "load.toml"
    path.write_text(load_recipe(SHIPPED, runs_at_once=48, slots=32))
    load = parse_recipe(path)
    assert load.trainer.max_concurrent_runs == 32 and len(load.run_configs()) == 48
    assert load.inference.max_loras == 64  # the newest adapter and an eval's, per slot


def test_an_eviction_takes_an_active_or_a_waiting_run_and_none_when_there_is_none():
    assert choose_eviction([], [], Random(0)) is None
    assert choose_eviction([], ["run_w"], Random(0)) == "run_w"
    picks = {choose_eviction(["run_a"], ["run_w"], Random(seed)) for seed in range(20)}
    assert picks == {"run_a", "run_w"}


# ---------------------------------------------------------------- the checks


def statuses(**status_of: str) -> list[RunStatus]:
    return [RunStatus(id=run_id, status=status, step=0) for run_id, status in status_of.items()]


def trainer(slots: dict[int, str], waiting: tuple[str, ...] = ()) -> dict:
    return {"max_runs": 2, "slots": {str(i): r for i, r in slots.items()}, "waiting": list(waiting)}


def test_a_slot_held_by_an_ended_or_gone_run_is_a_leak():
    runs = statuses(run_a="evicted", run_b="active", run_d="diverged")
    problems = checks.slot_problems(runs, trainer({0: "run_a", 1: "run_gone", 2: "run_d"}))
    assert problems == [
        "slot 0 held by run_a, which is evicted",
        "slot 1 held by run_gone, whose directory is gone",
        "slot 2 held by run_d, which is diverged",
    ]


def test_a_free_slot_while_a_run_waits_is_a_leak_and_full_slots_are_not():
    runs = statuses(run_a="active", run_w="waiting")
    (problem,) = checks.slot_problems(runs, trainer({0: "run_a"}))
    assert problem.startswith("1 slot(s) free while 1 run(s) wait")
    runs = statuses(run_a="active", run_b="active", run_w="waiting", run_e="evicted")
    assert checks.slot_problems(runs, trainer({0: "run_a", 1: "run_b"}, ("run_w",))) == []


def test_every_run_added_is_finished_evicted_training_or_queued_else_lost():
    runs = statuses(run_f="finished", run_e="evicted", run_a="active", run_w="waiting")
    runs += statuses(run_q="waiting", run_x="active", run_r="rejected", run_d="diverged")
    live = {"run_a": "running", "run_w": "running", "run_q": "running", "run_x": "exited"}
    added = ["run_f", "run_e", "run_d", "run_a", "run_w", "run_q", "run_x", "run_r", "run_gone"]
    lost = checks.lost_runs(added, runs, trainer({0: "run_a", 1: "run_x"}, ("run_w",)), live)
    assert lost == [
        "run_q: waiting, but not in the trainer's queue",
        "run_x: active, its orchestrator exited",
        "run_r: rejected: None",
        "run_gone: its directory is gone",
    ]


def test_a_run_whose_orchestrator_waits_for_inference_is_not_started_unless_inference_is_up():
    # A starved machine: vLLM still starting when the load ends. Its runs are queued, their
    # orchestrators wait for it: not started, not lost. With vLLM ready, a waiting
    # orchestrator is one the supervisor failed to start: lost.
    runs = statuses(run_a="active", run_w="waiting")
    queue = trainer({0: "run_a"}, ("run_w",))
    waiting = {"run_a": "waiting", "run_w": "waiting"}
    assert checks.lost_runs(["run_a", "run_w"], runs, queue, waiting, "starting") == []
    assert checks.not_started(["run_a", "run_w", "run_x"], waiting, "starting") == [
        "run_a",
        "run_w",
    ]
    assert checks.lost_runs(["run_a", "run_w"], runs, queue, waiting, "ready") == [
        "run_a: active, its orchestrator waiting",
        "run_w: waiting, its orchestrator waiting",
    ]
    assert checks.not_started(["run_a", "run_w"], waiting, "ready") == []  # lost, above


def finished_run(tmp_path: Path, trained: list[int], written: list[int]) -> Path:
    run = make_run(tmp_path, "run_a", "max_steps = 4\n")
    for step in written:
        append_metrics(run, "orchestrator", step - 1, reward_mean=0.5, written=True)
    append_metrics(run, "orchestrator", 1, reward_mean=0.5, written=False)  # a dropped batch
    for step in trained:
        append_metrics(run, "trainer", step, loss=0.1)
    return run


def test_a_finished_run_has_every_step_trained_and_every_batch_written(tmp_path: Path):
    complete = finished_run(tmp_path / "a", [1, 2, 3, 4], [1, 2, 3, 4])
    assert checks.metrics_problems(complete, finished=True) == []
    short = finished_run(tmp_path / "b", [1, 2, 4], [1, 2, 3])
    assert checks.metrics_problems(short, finished=True) == [
        "run_a: trained steps have gaps: 1-2,4",
        "run_a: finished with trainer steps 1-2,4",
        "run_a: finished with batches written for 1-3",
    ]
    assert checks.metrics_problems(finished_run(tmp_path / "c", [1, 2], [1, 2]), False) == []


def exit_record(code: int | None, *, asked: bool = False) -> dict:
    return {"time": "t", "code": code, "signal": None if code is not None else 9,
            "stop_requested": asked, "last_lines": []}  # fmt: skip


def test_exits_nobody_asked_for_are_crashes_except_an_orchestrator_done_or_evicted():
    state = {
        "processes": {
            "trainer": {"kind": "trainer", "exits": [exit_record(0, asked=True), exit_record(None)]},
            "inference": {"kind": "inference", "exits": [exit_record(0)]},
            "run_a": {"kind": "orchestrator", "exits": [exit_record(0), exit_record(3)]},
            "run_b": {"kind": "orchestrator", "exits": [exit_record(1), exit_record(None, asked=True)]},
        }
    }  # fmt: skip
    assert checks.crash_problems(state) == [
        "trainer ended unasked (signal 9) at t",
        "inference ended unasked (exit 0) at t",
        "run_b ended unasked (exit 1) at t",
    ]


# ---------------------------------------------------------------- the TUI's keys


def test_each_key_is_timed_to_the_frame_that_shows_its_effect(tmp_path: Path, monkeypatch):
    experiment = build_experiment(tmp_path)
    # Keys closer together than the benchmark's 1 s, so that 12 s go through every view.
    monkeypatch.setattr(load_keys, "KEY_GAP_S", 0.1)

    async def drive():
        app = FrameTimedApp(experiment)
        async with app.run_test(size=TUI_SIZE) as pilot:
            await wait_for_runs(app, 4, 30)
            stop = asyncio.Event()
            keys = asyncio.create_task(press_keys(app, pilot, stop))
            await asyncio.sleep(12)  # 5 cycles or more: move, enter, escape, move, a view, escape
            stop.set()
            return await keys, len(app.reader.poll_s)

    latencies, polls = asyncio.run(drive())
    assert latencies.timed_out == {}
    views = {key for key, _ in load_keys.VIEWS}
    assert {"down", "enter", "escape", "escape view", *views} <= set(latencies.by_key), latencies
    assert all(value > 0 for value in latencies.all_s)
    assert polls >= 1
    for _, parts in latencies.parts:  # where each key's time went adds up to its latency
        assert parts.cpu_wait_s is not None, "Linux says how long a thread waited for a CPU"
        assert parts.cpu_s + parts.cpu_wait_s <= parts.wall_s + 0.005


# ---------------------------------------------------------------- where a stall went


def stolen_s() -> float:
    """The virtual machine's CPUs' time taken by its host so far, all CPUs (/proc/stat's
    steal, in clock ticks): neither this thread running nor waiting in its run queue."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def test_a_collection_is_counted_as_the_collectors_time():
    meter = StallMeter()
    try:
        stolen_before = stolen_s()
        mark = meter.mark()
        garbage = [[] for _ in range(200_000)]
        for item in garbage:
            item.append(item)  # cycles: only the collector frees them
        del garbage, item
        gc.collect()
        parts = meter.since(mark)
        stolen = stolen_s() - stolen_before
    finally:
        meter.close()
    assert parts.gc_s > 0
    assert parts.cpu_s <= parts.wall_s and parts.gc_s <= parts.wall_s
    # This thread collected: the collection's wall time is this thread running or, on a
    # busy machine, ready to run while another process ran (its run-queue delay). 5 ms
    # covers the collector callbacks' own time around the clock reads. On a virtual
    # machine whose host took its CPUs meanwhile (steal, counted in whole ticks), that
    # time is neither: it is allowed, a tick per CPU more for the counting.
    if stolen > 0:
        stolen += os.cpu_count() / os.sysconf("SC_CLK_TCK")
    assert parts.gc_s <= parts.cpu_s + (parts.cpu_wait_s or 0.0) + 0.005 + stolen
    full = [c for c in parts.collections if c.generation == 2]
    assert full and full[-1].collected >= 200_000, "the collection that freed the cycles"


def test_a_thread_sharing_its_cpu_with_a_busy_process_is_seen_waiting_for_it():
    # Both on one CPU at the same priority: the kernel runs them in turn, so about half
    # of the busy loop's wall time is spent ready to run but not running.
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    affinity = os.sched_getaffinity(0)
    try:
        time.sleep(0.3)  # the hog has started spinning
        os.sched_setaffinity(0, {cpu})
        meter = StallMeter()
        mark = meter.mark()
        deadline = time.perf_counter() + 0.6
        while time.perf_counter() < deadline:
            pass
        parts = meter.since(mark)
        meter.close()
    finally:
        os.sched_setaffinity(0, affinity)
        hog.kill()
        hog.wait()
    assert parts.cpu_wait_s is not None
    assert parts.cpu_wait_s > 0.15, parts
    assert parts.cpu_s + parts.cpu_wait_s == pytest.approx(parts.wall_s, abs=0.1)


def test_a_thread_blocked_while_another_runs_python_sees_the_other_thread_run():
    # The poll worker's case: blocked, neither running nor ready, while the event loop's
    # thread runs. Here this thread waits while another spins for 0.4 s of CPU; the
    # spinner stays alive until the reading (a thread that has ended takes its time with it).
    import threading

    spun, release = threading.Event(), threading.Event()

    def spin() -> None:
        deadline = time.thread_time() + 0.4
        while time.thread_time() < deadline:
            pass
        spun.set()
        release.wait()

    meter = StallMeter()
    mark = meter.mark()
    other = threading.Thread(target=spin)
    other.start()
    spun.wait()
    parts = meter.since(mark)
    release.set()
    other.join()
    meter.close()
    assert parts.cpu_s < 0.1, "this thread only waited"
    assert parts.others_cpu_s is not None
    # The spinner's 0.4 s, and whatever the process's other threads ran meanwhile.
    assert 0.38 <= parts.others_cpu_s < 1.0, parts


# ---------------------------------------------------------------- the churn's process


def test_the_churn_runs_in_a_child_process_and_reports_when_stopped(tmp_path: Path):
    # The benchmark's process is the TUI's alone: the churn and the slot watch live in a
    # child, which hands over what it did when its stdin closes.
    experiment = build_experiment(tmp_path)
    background = BackgroundLoad(experiment, interval_s=60.0, seed=0)
    background.start()
    log, longest = background.stop()
    assert log.ticks == 0 and log.errors == []
    assert len(log.added) == 16, "the recipe's runs are counted as added"
    assert longest >= 0.0


# ---------------------------------------------------------------- for real


@pytest.mark.slow
def test_a_short_load_on_the_real_system_passes_every_check(tmp_path: Path):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
    report = run_load_benchmark(
        duration_s=20, interval_s=2, recipe=SHIPPED, results_dir=tmp_path / "results"
    )
    problems = [report[key] for key in ("crashes", "slot_problems", "metrics_problems")]
    assert report["ok"], (problems, report["runs"], report["after_down"], report["churn"])
    assert report["churn"]["ticks"] >= 5 and report["churn"]["added"] >= 5
    assert report["runs"]["added"] == 16 + report["churn"]["added"]
    assert report["tui"]["keys"]["n"] >= 5
    assert (tmp_path / "results" / "load-latest.json").is_file()


def test_a_slot_seen_once_held_by_a_run_that_just_finished_is_no_leak(tmp_path, monkeypatch):
    """Runs go on finishing while the checks look: the trainer frees a finished run's slot
    a moment after its finished.txt appears. The reading that settled is the one reported;
    one that stays wrong until the time is up is a leak."""
    from workbench.bench.faults.experiment import FaultExperiment
    from workbench.bench.load import runner
    from workbench.bench.load.churn import ChurnLog

    exp = FaultExperiment(tmp_path / "scratch", max_steps=2, checkpoint_interval=1)
    run = make_run(exp.path, "run_a", "max_steps = 2\n")
    (run / "control" / "finished.txt").write_text("step: 2\n")
    # Settled at the first look; at the next, run_a has just finished and its slot is
    # not yet free (the trainer frees it at its next step).
    readings = iter([{}, {0: "run_a"}])
    monkeypatch.setattr(
        runner,
        "read_trainer_state",
        lambda _: {"slots": next(readings, {}), "max_runs": 4, "waiting": []},
    )
    report = runner.settle_and_check(exp, ChurnLog())
    assert report["slot_problems"] == []

    readings = iter([])
    monkeypatch.setattr(
        runner, "read_trainer_state", lambda _: {"slots": {0: "run_a"}, "max_runs": 4}
    )
    monkeypatch.setattr(runner, "SETTLE_TIMEOUT_S", 0.5)
    report = runner.settle_and_check(exp, ChurnLog())
    assert report["slot_problems"] == ["slot 0 held by run_a, which is finished"]
