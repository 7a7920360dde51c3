"""`tracking/<run_id>.json`: which tracker run a workbench run went to, and how far.

Written by the forwarder after every batch it sent: the backend and project (another one
starts afresh), the tracker run's id (to resume it), and the inode of the run's
metrics.jsonl with the byte offset just past the last record sent (a replaced file starts
afresh too). A restarted supervisor continues from there and sends nothing twice.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.files import layout

FORMAT = "workbench.tracking_progress"


@dataclass
class Progress:
    backend: str
    project: str
    tracker_id: str
    inode: int | None
    offset: int  # bytes of metrics.jsonl forwarded
    records: int  # records sent


def read_progress(experiment: Path, run_id: str) -> Progress | None:
    """The run's progress file, or None when there is none or it cannot be read."""
    try:
        data = json.loads(layout.tracking_progress_path(experiment, run_id).read_text())
        return Progress(**{key: data[key] for key in Progress.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_progress(experiment: Path, run_id: str, progress: Progress) -> None:
    path = layout.tracking_progress_path(experiment, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, **asdict(progress)}
    layout.atomic_write_text(path, json.dumps(payload, indent=2) + "\n")
