"""`workbench bench tinker`'s pure parts (the recipe, the figures of a setting from its
step times and the trainer's spans, the summary), and one slow smoke run with --quick."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from workbench.bench import tinker as bench
from workbench.files.spans import Span
from workbench.up import read_recipe

REPO = Path(__file__).resolve().parents[2]


def _client(client: int, *steps: tuple[float, ...]) -> bench.ClientTimes:
    """Steps as (start, sampler_ready, sampled, submitted, done)."""
    return bench.ClientTimes(client, [bench.StepTimes(*step) for step in steps])


def test_the_recipe_is_valid_with_a_slot_per_client(tmp_path: Path):
    path = tmp_path / "recipe.toml"
    path.write_text(bench.recipe_text(tmp_path / "exp", 27))
    _, recipe = read_recipe(path)
    assert recipe.trainer.max_concurrent_runs == 27
    assert tomllib.loads(path.read_text())["inference"]["max_loras"] == 8


def test_overlap_counts_only_the_spans_inside_the_window():
    spans = [Span("update", "busy", 0.0, 1.0), Span("update", "busy", 2.0, 4.0)]
    assert bench.overlap_s(spans, 0.5, 3.0) == pytest.approx(0.5 + 1.0)
    assert bench.overlap_s(spans, 4.0, 9.0) == 0.0


def test_at_once_is_timed_from_the_common_start_in_a_row_as_the_sum_of_loops():
    clients = [_client(0, (0, 0.5, 1, 1, 3)), _client(1, (0, 0.5, 1, 2, 4))]
    compute = [Span("update", "busy", 1.5, 2.5)]
    together = bench.setting_of(clients, "at_once", compute)
    apart = bench.setting_of(clients, "in_a_row", compute)
    assert together.wall_s == 4 and together.steps_per_s == 0.5
    assert apart.wall_s == 7
    # round trips 2 s and 2 s; compute inside them 1.0 s and 0.5 s
    assert together.round_trip_ms == 2000
    assert together.sample_ms == 1000 and together.sampler_ms == 500
    assert together.overhead_ms == pytest.approx(1250)
    rows = bench.summary([together, apart])
    assert rows[0] == {"metric": "2 clients at once / in a row", "value": 1.75, "unit": "x"}


def test_summary_names_the_solo_overhead():
    solo = bench.setting_of([_client(0, (0, 0.5, 1, 1, 1.1))], "in_a_row", [])
    rows = bench.summary([solo])
    assert rows[-1]["metric"] == "solo round trip beyond compute"
    assert rows[-1]["value"] == pytest.approx(100.0)


def test_reward_and_centred_advantages():
    assert bench.reward(bench.PROMPT[::-1]) == 1.0
    assert bench.centred([1.0, 0.0]) == [0.5, -0.5]


@pytest.mark.slow
def test_quick_run_measures_every_setting(tmp_path: Path):
    pytest.importorskip("vllm")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "bench", "tinker", "--quick",
         "--results-dir", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "tinker-quick-latest.json").read_text())
    assert [(s["clients"], s["mode"]) for s in report["settings"]] == [
        (1, "at_once"), (1, "in_a_row"), (2, "at_once"), (2, "in_a_row"),
    ]  # fmt: skip
    for setting in report["settings"]:
        assert setting["steps"] == 2 * setting["clients"]
        assert 0 < setting["compute_ms"] <= setting["round_trip_ms"]
        assert 0 < setting["sampler_ms"] <= setting["sample_ms"]
        assert [len(c["steps"]) for c in setting["per_client"]] == [2] * setting["clients"]
    assert "beyond compute" in done.stdout
