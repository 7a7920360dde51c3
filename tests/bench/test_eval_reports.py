"""Benchmark reports about evals: the e2e report's held-out rewards per run, and what an
eval costs a training step (`bench eval`), on synthetic figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.bench.e2e import write_e2e_report
from workbench.bench.evaluation import summary_rows
from workbench.config import OrchestratorConfig

STARTED_AT = 1_700_000_000.0


def test_e2e_report_gives_each_runs_eval_rewards_their_duration_and_the_steps_wait(
    tmp_path: Path,
):
    run = tmp_path / "exp" / "run_a"
    run.mkdir(parents=True)
    lines = [
        {"source": "orchestrator", "step": step, "time": STARTED_AT + 10 * step,
         "reward_mean": 0.5, "policy_version": step, "eval_wait_s": 0.25}
        for step in range(4)
    ] + [
        {"source": "eval", "step": version, "time": STARTED_AT + 10 * version + 3,
         "policy_version": version, "eval_reward_mean": reward, "eval_s": seconds}
        for version, reward, seconds in [(0, 0.4, 1.0), (2, 0.6, 2.0), (4, 0.7, 4.0)]
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = write_e2e_report(run.parent, STARTED_AT, recipe=Path("r.toml"), results_dir=tmp_path)

    (summary,) = report["runs"]
    assert summary["evals"] == 3
    assert (summary["eval_reward_first"], summary["eval_reward_last"]) == (0.4, 0.7)
    assert summary["eval_s_median"] == 2.0
    assert summary["eval_wait_s_total"] == pytest.approx(1.0)
    assert report["evals"]["run_a"][1] == [23.0, 2, 0.6, 2.0]
    assert "e2e run_a: held-out reward first -> last eval" in {
        row["metric"] for row in report["summary"]
    }


def test_eval_cost_is_the_extra_time_of_a_step_with_an_eval_beside_it_spread_over_the_interval():
    medians = {"eval_alone": 0.3, "step_generation_alone": 0.6, "step_generation_with_eval": 0.9}
    rows = summary_rows(medians, OrchestratorConfig(eval={"interval": 10}))
    assert rows[0]["value"] == "0.300 s"
    assert rows[1]["value"] == "0.600 s / 0.900 s (+0.300 s, 0.030 s per step at eval.interval 10)"


def test_the_verifiers_case_is_the_built_in_runs_batch_and_lengths_on_the_taskset():
    from workbench.bench.env_speed import TASKS, verifiers_config

    config = OrchestratorConfig(
        env_args={"min_length": 9, "max_length": 9},
        batch_size=128,
        rollouts_per_prompt=8,
        sampling={"max_tokens": 20},
    )
    case = verifiers_config(config, None)
    assert case.env == "verifiers:vf_reverse_text"
    assert (TASKS / "vf_reverse_text.py").is_file(), "the shipped taskset"
    assert case.env_args["taskset"]["min_length"] == case.env_args["taskset"]["max_length"] == 9
    assert "harness" not in case.env_args, "verifiers' default: the in-process chat loop"
    before = verifiers_config(config, "null").env_args
    assert before["harness"] == "null" and before["max_concurrent"] == 32, "as verifiers ran"
    for key in ("prompts_per_step", "rollouts_per_prompt", "sampling", "eval", "seed"):
        assert getattr(case, key) == getattr(config, key), key


def test_episodes_per_second_are_reported_with_each_case_over_the_built_in():
    from workbench.bench.env_speed import summary_rows as environment_rows

    def case(step_s: float, eval_s: float) -> dict:
        return {
            "step_episodes": 128,
            "eval_episodes": 32,
            "medians_s": {"step": step_s, "eval": eval_s},
            "episodes_per_s": {"step": round(128 / step_s, 1), "eval": round(32 / eval_s, 1)},
        }

    rows = environment_rows({"reverse_text": case(0.5, 0.4), "verifiers:x": case(1.0, 0.5)})
    assert rows[0]["value"] == "256.0 / 80.0"
    assert rows[1]["value"] == "128.0 / 64.0; 2.00x the built-in step's time, 1.25x its eval's"


def test_the_cpu_of_a_process_tree_counts_its_children_running_and_ended():
    import subprocess
    import sys

    from workbench.bench.env_speed import _tree_cpu_seconds

    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    # A parent that runs a child spinning 0.3 CPU-seconds, spins as long itself, says so
    # and waits.
    program = (
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {spin!r}])\n{spin}"
        "print('spun', flush=True)\nimport time\ntime.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "spun\n"
        assert _tree_cpu_seconds(parent.pid) >= 0.6, "the ended child's and the parent's own"
        assert _tree_cpu_seconds(parent.pid, children=False) >= 0.3
    finally:
        parent.kill()
        parent.wait()
