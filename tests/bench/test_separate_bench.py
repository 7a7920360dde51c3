"""`bench e2e --vs separate`: its recipes, its memory plan, its curve check and its process
trees, without running an experiment (the benchmark itself runs under `just bench`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.bench.process_trees import TreeSampler, role_of, tree_members
from workbench.bench.separate import at_once_plan, compare_curves, curves_pass, speedups, verdict_of
from workbench.bench.separate_setup import SeparateBenchError, run_id_for, write_recipes
from workbench.recipe import load_recipe
from workbench.system.procfs import all_stats

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "reverse_text.toml"


def test_the_same_runs_make_one_experiment_and_as_many_of_one_run(tmp_path: Path):
    experiments = write_recipes(RECIPE, 4, tmp_path)
    (shared,) = experiments["shared"]
    assert shared.run_ids == ("lr1e-3", "lr2e-3", "lr3e-3", "lr5e-3")
    assert [e.run_ids for e in experiments["separate"]] == [(r,) for r in shared.run_ids]
    loaded = load_recipe(shared.recipe)
    assert [run.lr for run in loaded.run_configs().values()] == [1e-3, 2e-3, 3e-3, 5e-3]
    for experiment in experiments["separate"]:
        alone = load_recipe(experiment.recipe)
        # Every setup has the same settings but its runs: a run is the same run everywhere.
        assert alone.trainer == loaded.trainer and alone.inference == loaded.inference
        assert alone.defaults == loaded.defaults
        assert alone.output_dir == Path("outputs") / experiment.name
    assert len({e.cwd for e in experiments["separate"]} | {shared.cwd}) == 5


def test_thirty_two_runs_get_their_slots_and_distinct_learning_rates(tmp_path: Path):
    (shared,) = write_recipes(RECIPE, 32, tmp_path)["shared"]
    loaded = load_recipe(shared.recipe)
    assert loaded.trainer.max_concurrent_runs == 32 and loaded.inference.max_loras == 64
    assert len(set(shared.run_ids)) == 32
    with pytest.raises(SeparateBenchError, match="1 to 32"):
        write_recipes(RECIPE, 33, tmp_path / "thirty-three")
    assert run_id_for(1.5e-3) == "lr1p5e-3"


def test_experiments_run_at_once_only_when_their_memory_fits():
    alone = {"per_experiment": [{"peak_rss_mb": 3000}] * 4}
    assert at_once_plan(alone, available_bytes=20_000 * 2**20) is None
    why = at_once_plan(alone, available_bytes=12_000 * 2**20)
    assert why is not None and "4 x 3000 MB" in why and "12000 MB available" in why


def curves(*runs):
    return {run_id: {"curve": curve} for run_id, curve in runs}


def test_a_curve_far_from_the_shared_one_with_the_same_adapter_is_a_split_that_fails_alone():
    shared = curves(("a", [[0, 0.5, 0], [1, 0.6, 0], [2, 0.7, 1]]))
    same = {"shared": {"runs": shared}, "one_after_another": {"runs": shared}}
    result = compare_curves(same, async_level=1)
    assert result["identical"] and not result["failures"] and not result["drift"]
    assert verdict_of(result) == "identical" and curves_pass(result)
    other = curves(("a", [[0, 0.5, 0], [1, 0.7, 0], [2, 0.7, 1]]))
    result = compare_curves({"shared": {"runs": shared}, "at_once": {"runs": other}}, 1)
    assert not result["identical"] and not result["failures"]
    assert result["splits"] == ["a step 1 in at_once: shared [0.6, 0] vs [0.7, 0]"]
    assert result["split_runs"] == ["a"]
    # Without a seed control to say otherwise, a split fails the benchmark.
    assert not curves_pass(result)
    assert verdict_of(result).startswith("DIFFERENT: a step 1 in at_once")
    assert "no seed control run" in verdict_of(result)


def test_a_curve_that_drifts_within_the_tolerance_is_reported_not_failed():
    # The last bits of a packed run's adapter: one completion sampled differently late on.
    shared = curves(("a", [[0, 0.5, 0], [1, 0.6, 1], [2, 0.70, 2], [3, 0.72, 3]]))
    drifted = curves(("a", [[0, 0.5, 0], [1, 0.6, 1], [2, 0.701, 2], [3, 0.71, 3]]))
    result = compare_curves({"shared": {"runs": shared}, "at_once": {"runs": drifted}}, 1)
    assert not result["identical"] and not result["failures"]
    assert result["drift"] == ["a step 2 in at_once: shared [0.7, 2] vs [0.701, 2]"]
    assert result["max_drift"] == pytest.approx(0.01)
    assert "largest gap 0.0100 from the first step that differs" in verdict_of(result)


def test_another_adapter_chosen_by_timing_is_reported_not_failed_unless_synchronous():
    shared = curves(("a", [[0, 0.5, 0], [1, 0.6, 0]]))
    later = curves(("a", [[0, 0.5, 0], [1, 0.65, 1]]))
    setups = {"shared": {"runs": shared}, "one_after_another": {"runs": later}}
    result = compare_curves(setups, async_level=1)
    assert not result["identical"] and not result["failures"] and len(result["timing"]) == 1
    assert compare_curves(setups, async_level=0)["failures"]
    missing = {"shared": {"runs": shared}, "one_after_another": {"runs": curves(("a", []))}}
    assert compare_curves(missing, 1)["failures"] == ["a in one_after_another: 0 steps, shared 2"]


def test_speedup_is_separate_wall_time_over_shared():
    setups = {
        "shared": {"wall_s": 100.0},
        "one_after_another": {"wall_s": 216.0},
        "at_once": {"skipped": "does not fit"},
    }
    assert speedups(setups) == {"one_after_another": 2.16, "at_once": None}


def test_without_the_separate_setups_only_the_shared_experiment_runs(tmp_path, monkeypatch):
    from workbench.bench import separate

    ran = []
    monkeypatch.setattr(separate, "run_setup", lambda setup, *_, **__: ran.append(setup) or {})
    experiments = write_recipes(RECIPE, 2, tmp_path)
    setups = separate._run_setups(experiments, 5, 60.0, at_once=True, separate=False)
    assert ran == ["shared"]
    assert setups["one_after_another"]["skipped"] == setups["at_once"]["skipped"]
    assert "--no-separate" in setups["at_once"]["skipped"]


def test_roles_come_from_the_nearest_ancestor_that_names_one():
    assert role_of(["python", "-m", "workbench.inference", "--config", "x"]) == "inference"
    assert role_of(
        ["python", "-m", "torch.distributed.run", "-m", "workbench.trainer.rl.trainer"]
    ) == ("trainer")
    assert role_of(["python", "-m", "workbench.orchestrator", "--run-dir", "r"]) == "orchestrator"
    assert role_of(["python", "-m", "workbench.cli", "up", "r.toml"]) is None


def test_a_tree_is_sampled_with_its_children_memory_and_cpu():
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        sampler = TreeSampler()
        tree = sampler.watch("t", parent.pid)
        deadline = 100
        while len(tree_members(parent.pid, all_stats() or [])) < 2 and deadline:
            subprocess.run(["sleep", "0.05"])
            deadline -= 1
        sampler.sample()
        assert len(tree.cpu) == 2 and tree.peak_rss_bytes > 1 << 20
        assert set(role for role, _ in tree.cpu.values()) == {"up"}
        assert sampler.peak_total_rss_bytes == tree.peak_rss_bytes
        assert tree_members(os.getpid(), all_stats() or [])[0].pid == os.getpid()
    finally:
        for stat in tree_members(parent.pid, all_stats() or [])[::-1]:
            os.kill(stat.pid, 9)
        parent.wait()


def test_an_exited_child_not_yet_reaped_keeps_the_role_it_ran_as():
    # A zombie has no command line; counted as its parent's role, an orchestrator's whole
    # CPU once showed up as the supervisor's.
    script = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(1.5)', 'workbench.' + sys.argv[2]]); "
        "time.sleep(30)"  # never reaps it
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, "workbench.supervisor", "orchestrator"]
    )
    try:
        sampler = TreeSampler()
        tree = sampler.watch("t", parent.pid)
        deadline = time.monotonic() + 20
        while len(tree.cpu) < 2 and time.monotonic() < deadline:
            sampler.sample()
            time.sleep(0.05)
        while time.monotonic() < deadline:
            members = tree_members(parent.pid, all_stats() or [])
            if any(member.exited for member in members):
                break
            time.sleep(0.1)
        sampler.sample()
        assert sorted(role for role, _ in tree.cpu.values()) == ["orchestrator", "supervisor"]
    finally:
        for stat in tree_members(parent.pid, all_stats() or [])[::-1]:
            os.kill(stat.pid, 9)
        parent.wait()
