"""Population-based training in the running supervisor: a run behind at a judged step is
replaced by a fork of the run ahead, and the fork takes its trainer slot before a run
that was waiting for one.

The real daemon, the real slot bookkeeping (`standin_trainer.py` runs `MultiRunManager`),
orchestrator stand-ins that write eval records while their run holds a slot, and the
winner's trainer checkpoint as the trainer leaves it (a STABLE part; training from it is
tests/e2e/test_pbt_e2e.py).
"""

from __future__ import annotations

import json
import os
import tomllib

from tests.helpers import wait_for
from tests.supervisor.conftest import StandinExperiment
from tests.supervisor.test_early_stopping import curve, slots, with_slots
from workbench.files import layout, run_control
from workbench.sweep.files import read_pbt

PBT = """
[defaults.eval]
interval = 2

[sweep]
grid.lr = [1e-3, 3e-3]

[sweep.scheduler]
kind = "pbt"
interval = 2
quantile = 0.5
min_runs = 2
"""


def test_a_run_behind_is_replaced_by_a_fork_of_the_run_ahead_which_takes_its_slot(
    standin: StandinExperiment,
):
    recipe = layout.recipe_path(standin.path)
    text = recipe.read_text().replace("max_steps = 7", "max_steps = 7\ncheckpoint_interval = 2")
    recipe.write_text(text + PBT)
    with_slots(standin, 2, ["--write-metrics"])
    run_a, run_b, run_c = standin.add_runs("run_a", "run_b", "run_c")
    for age, run in enumerate((run_a, run_b, run_c)):  # admitted in this order
        os.utime(layout.orch_config_path(run), ns=(age * 10**9, age * 10**9))
    with layout.staged_directory(layout.checkpoint_part_dir(run_a, 2, "trainer")) as part:
        (part / "progress.json").write_text(json.dumps({"step": 2}))
    # run_a learns fast and reaches step 2 first; run_b is slow and poor; run_c waits.
    curve(run_a, [0.5, 0.6, 0.7, 0.8, 0.9], interval_s=0.05)
    curve(run_b, [0.1, 0.1, 0.1, 0.1, 0.1], interval_s=0.4)
    curve(run_c, [0.5, 0.6, 0.7], interval_s=0.05)
    standin.start()

    wait_for(lambda: slots(standin.path) == ["run_a", "run_b"], 30, "run_a and run_b to get slots")
    eviction = wait_for(lambda: run_control.read_eviction(run_b), 30, "run_b to be replaced")
    assert eviction.evicted_by == "pbt"
    assert eviction.reason.startswith(
        "pbt step 2: eval_reward_mean 0.1, rank 2/2, in the bottom quantile: run_a@2 "
    ), eviction.reason
    fork = standin.path / "run_b-pbt1"
    config = tomllib.loads(layout.orch_config_path(fork).read_text())
    assert config["forked_from"] == {"run": "run_a", "step": 2}

    wait_for(lambda: "run_b-pbt1" in slots(standin.path), 10, "the fork to take run_b's slot")
    assert slots(standin.path) == ["run_a", "run_b-pbt1"]
    # run_c never held a slot (its stand-in writes records only while it holds one): the
    # fork queued in run_b's place, ahead of it.
    assert not layout.metrics_path(run_c).exists() and run_control.read_eviction(run_c) is None
    saved = read_pbt(standin.path)
    assert saved is not None and saved.actions[("run_b", 2)] == "evicted"
