"""The benchmarks' tables stay whole when their output is piped or logged: every header
printed as written, no cell cut with an ellipsis, although rich lays out a console that
is no terminal in 80 columns."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.table import Table

from workbench.bench import e2e, evaluation, inference, separate, supervisor, sweep, trainer

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _report(name: str) -> dict[str, Any]:
    """The newest result the benchmark wrote, with what its printer adds beside it."""
    return {"plot": f"benchmarks/results/{name}-latest.png", **_latest(name)}


def _latest(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}-latest.json").read_text())


PRINTERS: dict[str, tuple[Callable[[Any], None], Callable[[], Any]]] = {
    "e2e": (e2e.print_table, lambda: _report("e2e")),
    "e2e-separate": (separate.print_table, lambda: _report("e2e-separate")),
    "sweep": (sweep.print_table, lambda: _report("sweep")),
    "supervisor": (supervisor.print_table, lambda: _report("supervisor")),
    "eval": (evaluation.print_table, lambda: _report("eval")),
    "inference": (inference.print_table, lambda: _report("inference")),
    "trainer": (
        trainer.print_table,
        lambda: [trainer.Measurement(**m) for m in _latest("trainer")["measurements"]],
    ),
}


@pytest.mark.parametrize("benchmark", sorted(PRINTERS))
def test_a_piped_benchmark_table_prints_every_header_whole(
    benchmark: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("COLUMNS", raising=False)  # rich's width for a pipe: 80 columns
    headers: list[str] = []
    add_column = Table.add_column

    def recording_add_column(self: Table, header: Any = "", *args: Any, **kwargs: Any) -> None:
        headers.append(str(header))
        add_column(self, header, *args, **kwargs)

    monkeypatch.setattr(Table, "add_column", recording_add_column)
    print_table, report = PRINTERS[benchmark]
    print_table(report())
    lines = capsys.readouterr().out.splitlines()  # captured: no terminal
    assert headers, "the printer made no table"
    header_lines = [line for line in lines if line.startswith("┃")]
    for header in headers:
        assert any(header in line for line in header_lines), f"header {header!r} cut or wrapped"
    assert not [line for line in lines if "…" in line], "a cell cut with an ellipsis"
    tables = [line for line in lines if line.startswith("┏")]
    assert len(header_lines) == len(tables), "a table's headers on more than one line"
