"""The benchmarks' report code on synthetic data: no vLLM, no trainer, no timings asserted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_for
from workbench.bench.e2e import write_e2e_report
from workbench.bench.inference import (
    Configuration,
    Pass,
    descendants_cpu_s,
    request_body,
    summary_rows,
)
from workbench.bench.inference import Workload as InferenceWorkload
from workbench.system.procfs import child_pids

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STARTED_AT = 1_700_000_000.0


def write_metrics(run: Path, lines: list[dict | str]) -> None:
    run.mkdir(parents=True)
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    (run / "metrics.jsonl").write_text(text)


def orchestrator_line(step: int, seconds: float, reward: float) -> dict:
    return {
        "source": "orchestrator",
        "step": step,
        "time": STARTED_AT + seconds,
        "reward_mean": reward,
        "reward_std": 0.1,
        "policy_version": max(0, step - 1),
    }


@pytest.fixture
def synthetic_experiment(tmp_path: Path) -> Path:
    """Two runs of 10 steps (one learning, one flat) and a run that never reached a step."""
    experiment = tmp_path / "exp"
    learning = [orchestrator_line(step, 60 + 30 * step, 0.3 + 0.05 * step) for step in range(10)]
    trainer_lines = [
        {"source": "trainer", "step": step, "time": STARTED_AT + 70 + 30 * step, "loss": 0.5}
        for step in range(10)
    ]
    write_metrics(experiment / "run_learning", learning + trainer_lines + ['{"torn": '])
    write_metrics(
        experiment / "run_flat",
        [orchestrator_line(step, 90 + 15 * step, 0.5) for step in range(10)],
    )
    write_metrics(experiment / "run_empty", [])
    return experiment


def test_e2e_report_writes_json_and_png_of_every_runs_reward_curve(synthetic_experiment, tmp_path):
    results = tmp_path / "results"
    report = write_e2e_report(
        synthetic_experiment,
        STARTED_AT,
        recipe=Path("recipes/reverse_text.toml"),
        details={"exit_code": 0},
        results_dir=results,
    )

    png = results / "e2e-latest.png"
    assert report["plot"] == str(png)
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert Path(report["path"]).with_suffix(".png").read_bytes().startswith(PNG_SIGNATURE)

    saved = json.loads((results / "e2e-latest.json").read_text())
    assert saved["benchmark"] == "e2e" and saved["exit_code"] == 0
    assert saved["curve_columns"] == ["seconds", "step", "reward_mean", "policy_version"]
    # Orchestrator lines only (trainer lines and a torn line are not reward points), in
    # seconds since the start.
    assert saved["curves"]["run_learning"][0] == [60.0, 0, 0.3, 0]
    assert len(saved["curves"]["run_learning"]) == 10
    assert saved["curves"]["run_empty"] == []


def test_e2e_report_summarises_first_and_last_five_steps_and_pace_per_run(
    synthetic_experiment, tmp_path
):
    report = write_e2e_report(
        synthetic_experiment, STARTED_AT, recipe=Path("r.toml"), results_dir=tmp_path
    )
    runs = {run["run_id"]: run for run in report["runs"]}

    learning = runs["run_learning"]
    assert learning["steps"] == 10
    assert learning["reward_first5_mean"] == pytest.approx(0.4)  # steps 0-4: 0.30 .. 0.50
    assert learning["reward_last5_mean"] == pytest.approx(0.65)  # steps 5-9: 0.55 .. 0.75
    assert learning["reward_gain"] == pytest.approx(0.25)
    assert learning["steps_per_min"] == pytest.approx(2.0)  # one step every 30 s
    assert learning["first_step_s"] == pytest.approx(60)
    assert learning["wall_s"] == pytest.approx(330)

    flat = runs["run_flat"]
    assert flat["reward_gain"] == pytest.approx(0.0)
    assert flat["steps_per_min"] == pytest.approx(4.0)

    assert runs["run_empty"]["points"] == 0
    metrics = [row["metric"] for row in report["summary"]]
    assert "e2e run_learning: reward first 5 -> last 5" in metrics
    assert "e2e run_empty" in metrics


def test_inference_summary_gives_each_configuration_its_ratio_to_the_base_model():
    configurations = [
        Configuration(0, [Pass(1.0, 1000, api_server_cpu_s=0.4, engine_cpu_s=0.9)]),
        Configuration(2, [Pass(2.0, 1000, api_server_cpu_s=0.5, engine_cpu_s=1.9)]),
    ]
    base = configurations[0].median_tokens_per_s
    for configuration in configurations:
        configuration.ratio_vs_base = configuration.median_tokens_per_s / base
    rows = summary_rows(
        {
            "server_startup_s": 12.3,
            "first_pass_s": 0.25,
            "configurations": [c.to_json() for c in configurations],
        }
    )
    assert rows == [
        {"metric": "inference: server startup", "value": "12.3 s"},
        {"metric": "inference: first pass after startup", "value": "0.25 s"},
        {"metric": "inference: base model", "value": "1000 tok/s, API server 0.40 CPU-s a pass"},
        {
            "metric": "inference: 2 adapters",
            "value": "500 tok/s (0.50x base), API server 0.50 CPU-s a pass",
        },
    ]


def test_inference_requests_force_full_length_completions_so_every_configuration_does_equal_work():
    workload = InferenceWorkload(prompts=2, completions_per_prompt=3, max_tokens=16, repetitions=1)
    body = request_body([{"role": "user", "content": "abc"}], "adapter", workload, seed=7)
    assert body["ignore_eos"] is True
    assert (body["n"], body["max_tokens"], body["seed"]) == (3, 16, 7)
    assert workload.completion_tokens == 2 * 3 * 16


def test_the_servers_engine_cpu_counts_every_process_below_the_api_server():
    # A child that spins, with a grandchild that spins: both are the "engine".
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    script = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {spin!r} + 'time.sleep(30)'])\n"
        f"exec({spin!r})\n"
        "print('spun', flush=True)\n"
        "time.sleep(30)\n"
    )
    before = descendants_cpu_s(os.getpid())
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "spun"
        spent = lambda: descendants_cpu_s(os.getpid()) - before >= 0.6  # noqa: E731
        wait_for(spent, 30, "the child's and the grandchild's 0.6 CPU-seconds")
    finally:
        for pid in child_pids(process.pid):
            os.kill(pid, signal.SIGKILL)
        process.kill()
        process.wait()
