"""A sweep end to end with every real part: vLLM's CPU build, the torchrun trainer, one
orchestrator per run, the supervisor with early stopping, the built-in tiny model.

Five learning rates through two trainer slots, 8 steps each, an eval every 4 versions and
one ASHA rung at step 4 (min_runs 3). Slots go in recipe order: 5e-3 and 3e-3 first, then
1e-6, 2e-6 and 4e-3 wait. Why the outcome is certain rather than likely:

- The two low learning rates cannot learn: after 4 updates of 1e-6 or 2e-6 their adapters
  are about 1e-5 from zero, and their greedy held-out reward is the base model's (0.61).
  The good learning rates are well above it by version 4 (the shipped recipe's runs are
  at 0.67-0.75 on their training batches by step 4, 0.84-0.86 held out by version 10).
- The first two runs to record the rung are too few to judge (min_runs 3): they wait. A
  low-lr run gets a slot only when one of them finishes, so when it reaches the rung both
  good values are recorded; being below both, it is below the median and stops (ties
  never stop a run, but a low-lr run is strictly below). The two good runs, judged then,
  are at or above that median and go on (they have finished by then anyway). The second
  low-lr run is below the median of four values of which two are good; the last good run
  is above the median of five of which two are low.
- The last run (4e-3) gets a slot only when a low-lr run leaves (the good runs' slots went
  to the low-lr ones), so it is the queued run that takes an evicted run's slot.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from tests.e2e.cli import workbench
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow

GOOD = ("run_lr5e-3", "run_lr3e-3", "run_lr4e-3")
LOW = ("run_lr1e-6", "run_lr2e-6")
QUEUED_LAST = "run_lr4e-3"
REASON = re.compile(
    r"asha rung 0 \(step 4\): eval_reward_mean [0-9.]+ < cutoff [0-9.]+, rank [0-9]+/[0-9]+"
)

RECIPE = """
[experiment]
name = "sweep_e2e"
output_dir = "outputs/sweep_e2e"

[model]
base = "builtin:tiny-reverse"

[inference]
max_loras = 4

[trainer]
max_concurrent_runs = 2
lora = { rank = 8, alpha = 16 }

[defaults]
env = "reverse_text"
env_args = { min_length = 9, max_length = 9 }
max_steps = 8
batch_size = 128
rollouts_per_prompt = 8
async_level = 1
checkpoint_interval = 0

[defaults.eval]
interval = 4

[sweep]
grid.lr = [5e-3, 3e-3, 1e-6, 2e-6, 4e-3]

[sweep.scheduler]
kind = "asha"
grace_steps = 4
reduction_factor = 2
min_runs = 3
"""


def first_trained_at(run: Path) -> float:
    """Unix time of the trainer's first step of `run`."""
    return min(m["time"] for m in read_metrics(run, "trainer"))


def evicted_at(run: Path) -> float:
    eviction = run_control.read_eviction(run)
    assert eviction is not None and eviction.evicted_at is not None
    return dt.datetime.fromisoformat(eviction.evicted_at).timestamp()


def test_asha_stops_the_runs_that_cannot_learn_and_a_queued_run_takes_the_slot(tmp_path: Path):
    recipe = tmp_path / "sweep.toml"
    recipe.write_text(RECIPE)
    experiment = tmp_path / "outputs" / "sweep_e2e"
    try:
        result = workbench("up", str(recipe), "--headless", cwd=tmp_path, timeout=12 * 60)
    finally:
        if (experiment / "supervisor").exists():
            workbench("down", str(experiment), cwd=tmp_path, timeout=180)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, "runs stopped early are an outcome, not a failure\n" + output

    for run_id in LOW:
        eviction = run_control.read_eviction(experiment / run_id)
        assert eviction is not None, f"{run_id} was not stopped\n{output}"
        assert eviction.evicted_by == "asha"
        assert REASON.fullmatch(eviction.reason), eviction.reason
    # Evicted (its slot freed) one second or more before the queued run's first step.
    first_eviction = min(evicted_at(experiment / run_id) for run_id in LOW)
    assert first_trained_at(experiment / QUEUED_LAST) >= first_eviction

    for run_id in GOOD:
        run = experiment / run_id
        assert run_control.is_finished(run) and run_control.read_eviction(run) is None, run_id
        evals = read_metrics(run, "eval")
        # The base model, the first version loaded at or past 4 (one the loop skipped,
        # when the trainer got two ahead, is not evaluated), and the last version.
        versions = [e["policy_version"] for e in evals]
        assert len(versions) == 3 and versions[0] == 0 and versions[2] == 8, f"{run_id}: {evals}"
        assert versions[1] in (4, 5), f"{run_id}: {evals}"
        assert evals[-1]["eval_reward_mean"] > evals[0]["eval_reward_mean"], evals

    asha = json.loads((experiment / "sweep" / "asha.json").read_text())
    stopped = {r["run_id"] for r in asha["results"] if r["decision"] == "stop"}
    assert stopped == set(LOW), asha["results"]

    report = workbench("sweep", "report", str(experiment), "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    ranking = json.loads(report.stdout)
    assert ranking["best"]["id"] in GOOD, ranking
    assert ranking["best"]["differences"]["lr"] in (5e-3, 3e-3, 4e-3)
    evicted = {run["id"] for run in ranking["runs"] if run["evicted_by_scheduler"]}
    assert evicted == set(LOW)
    assert (experiment / "sweep_report.png").stat().st_size > 0
    assert layout.latest_stable_step(layout.broadcasts_dir(experiment / QUEUED_LAST)) == 8
