"""A benchmark result names the code it measured: the commit and any local edit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.bench.results import CHECKOUT, code, write_result


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "checkout"
    for path in ("workbench/trainer.py", "benchmarks/results/e2e-latest.json", "docs/a.md"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("v1\n")
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


def test_a_clean_checkout_is_named_by_its_commit(checkout: Path):
    info = code(checkout)
    assert info["commit"] == _git(checkout, "rev-parse", "HEAD")
    assert info["edited"] == []


def test_an_edited_file_is_named_but_results_and_docs_are_not(checkout: Path):
    # A bench run rewrites the tracked `-latest` results, and docs quote the figures: neither
    # changes what is measured. An edit to the code does, and the result must say so.
    (checkout / "benchmarks/results/e2e-latest.json").write_text("v2\n")
    (checkout / "docs/a.md").write_text("v2\n")
    assert code(checkout)["edited"] == []
    (checkout / "benchmarks/results/e2e-20261206.json").write_text("{}\n")
    assert code(checkout)["edited"] == []
    (checkout / "workbench/trainer.py").write_text("v2\n")
    (checkout / "workbench/new_module.py").write_text("v1\n")
    assert code(checkout)["edited"] == ["workbench/new_module.py", "workbench/trainer.py"]


def test_outside_a_checkout_only_the_version_is_known(tmp_path: Path):
    info = code(tmp_path)
    assert "commit" not in info
    assert "version" in info


def test_a_written_result_carries_the_machine_and_the_code(tmp_path: Path):
    path = write_result("example", {"wall_s": 1.5}, results_dir=tmp_path)
    document = json.loads(path.read_text())
    assert document["wall_s"] == 1.5
    assert document["machine"]["cpus"] >= 1
    assert document["code"] == code()
    if (CHECKOUT / ".git").exists():
        assert document["code"]["commit"] == _git(CHECKOUT, "rev-parse", "HEAD")
    assert json.loads((tmp_path / "example-latest.json").read_text()) == document


def test_a_result_written_by_workbench_bench_records_its_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The figures page gives each result's command; from the command line it is exact."""
    monkeypatch.setattr(sys, "argv", ["/venv/bin/workbench", "bench", "e2e", "--runs", "8"])
    document = json.loads(write_result("example", {}, results_dir=tmp_path).read_text())
    assert document["invocation"] == ["workbench", "bench", "e2e", "--runs", "8"]
    monkeypatch.setattr(sys, "argv", ["pytest", "tests/bench"])
    assert "invocation" not in json.loads(write_result("other", {}, tmp_path).read_text())
