"""Population-based training end to end with every real part: vLLM's CPU build, the
torchrun trainer, the orchestrators, the supervisor's PBT, the built-in tiny model.

Two learning rates through one trainer slot, 6 steps each, an eval and a checkpoint every
3 versions, PBT judging at step 3 (min_runs 2, so one run in each quantile). 5e-3 runs
first; 1e-6 waits for the slot. Why the exploit is certain rather than likely:

- The first run is judged at step 3 against the second's eval of the base model (which
  needs no slot), goes on as the better of two, and trains on to step 6, keeping
  checkpoints of steps 3 and 6; it finishes before the second gets the slot.
- 1e-6 cannot learn: after 3 updates its adapter is about 1e-5 from zero and its greedy
  held-out reward is the base model's. At step 3 it is ranked against the first run's
  latest value (its final eval, above the base model's: the shipped recipe's runs are
  at 0.67-0.75 on their training batches by step 4), so it is in the bottom quantile and
  takes the first run's checkpoint of step 3 (the newest below max_steps), with the
  learning rate perturbed, as `run_lr1e-6-pbt1`, which trains steps 4 to 6 in the slot.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from tests.e2e.cli import workbench
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow

WINNER, LOSER, FORK = "run_lr5e-3", "run_lr1e-6", "run_lr1e-6-pbt1"
REASON = re.compile(
    r"pbt step 3: eval_reward_mean [0-9.]+, rank 2/2, in the bottom quantile: "
    r"run_lr5e-3@3 \(eval_reward_mean [0-9.]+\) goes on as run_lr1e-6-pbt1 with lr 0\.005 -> .+"
)

RECIPE = """
[experiment]
name = "pbt_e2e"
output_dir = "outputs/pbt_e2e"

[model]
base = "builtin:tiny-reverse"

[inference]
max_loras = 2

[trainer]
max_concurrent_runs = 1
lora = { rank = 8, alpha = 16 }

[defaults]
env = "reverse_text"
env_args = { min_length = 9, max_length = 9 }
max_steps = 6
batch_size = 128
rollouts_per_prompt = 8
async_level = 1
checkpoint_interval = 3

[defaults.eval]
interval = 3

[sweep]
grid.lr = [5e-3, 1e-6]

[sweep.scheduler]
kind = "pbt"
interval = 3
min_runs = 2
"""


def test_a_run_behind_takes_the_checkpoint_of_a_run_ahead_and_trains_on_from_its_step(
    tmp_path: Path,
):
    recipe = tmp_path / "pbt.toml"
    recipe.write_text(RECIPE)
    experiment = tmp_path / "outputs" / "pbt_e2e"
    try:
        result = workbench("up", str(recipe), "--headless", cwd=tmp_path, timeout=8 * 60)
    finally:
        if (experiment / "supervisor").exists():
            workbench("down", str(experiment), cwd=tmp_path, timeout=180)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, "a run PBT replaced is an outcome, not a failure\n" + output

    pbt = json.loads((experiment / "sweep" / "pbt.json").read_text())
    exploits = [d for d in pbt["decisions"] if d["decision"] == "exploit"]
    assert len(exploits) == 1, pbt["decisions"]
    exploit = exploits[0]
    assert (exploit["run_id"], exploit["step"], exploit["source"], exploit["source_step"]) == (
        LOSER, 3, WINNER, 3,
    )  # fmt: skip
    # The loser has 3 steps left after its judged eval, about 3 s on this model, and often
    # finishes them before the supervisor's eviction lands (two of three runs on
    # 2026-11-27, one of them on a quiet machine). Then it keeps its finish, and the fork
    # takes the slot it left all the same.
    assert exploit["new_run"] == FORK and exploit["action"] in ("evicted", "finished"), exploit
    assert exploit["value"] < exploit["source_value"]

    eviction = run_control.read_eviction(experiment / LOSER)
    if exploit["action"] == "evicted":
        assert eviction is not None and eviction.evicted_by == "pbt"
        assert REASON.fullmatch(eviction.reason), eviction.reason
    else:
        assert eviction is None and run_control.is_finished(experiment / LOSER)

    fork = experiment / FORK
    config = tomllib.loads(layout.orch_config_path(fork).read_text())
    assert config["forked_from"] == {"run": WINNER, "step": 3}
    old, new = exploit["changes"]["lr"]
    assert old == 5e-3 and config["lr"] == new and new != old
    # It went on from the winner's step 3 with the winner's adapter: its first update is
    # step 4, its last 6, and it finished in the slot the loser left.
    steps = [m["step"] for m in read_metrics(fork, "trainer")]
    assert steps and steps[0] == 4 and steps[-1] == 6, steps
    assert run_control.is_finished(fork)
    first_eval = read_metrics(fork, "eval")[0]
    assert first_eval["step"] >= 3, first_eval

    report = workbench("sweep", "report", str(experiment), "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    ranking = json.loads(report.stdout)
    lineages = {run["id"]: run["lineage"] for run in ranking["runs"]}
    assert lineages[FORK] == [FORK, f"{WINNER}@3"]
    assert lineages[WINNER] == [WINNER]
    shown = workbench("sweep", "report", str(experiment), cwd=tmp_path)
    assert "pbt step 3" in shown.stdout, shown.stdout
