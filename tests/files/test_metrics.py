"""metrics.jsonl: one line per record, and a line cut short does not take the next one."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import make_run
from workbench.files import layout
from workbench.files.metrics import append_metrics, read_metrics


def test_a_record_after_a_line_cut_short_by_a_full_disk_is_kept(tmp_path: Path):
    run = make_run(tmp_path, "run_a")
    append_metrics(run, "trainer", 1, loss=0.5)
    with open(layout.metrics_path(run), "ab") as handle:
        handle.write(b'{"source":"trainer","step":2,"lo')  # the write a full disk cut
    append_metrics(run, "trainer", 3, loss=0.25)
    assert [m["step"] for m in read_metrics(run, "trainer")] == [1, 3]
    lines = layout.metrics_path(run).read_text().splitlines()
    assert len(lines) == 3 and lines[1].endswith('"lo')
