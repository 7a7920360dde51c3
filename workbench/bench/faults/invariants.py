"""What a faulted experiment must still satisfy, read from its directory after `down`.

Pure reads of files, so the same checks serve the benchmark and the tests.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from workbench.files import layout
from workbench.files.metrics import read_metrics

# Written by RunCheckpointer.restore: "run <id> resumed from <directory>".
_RESUMED = re.compile(r"run (\S+) resumed from (\S+)")


def recomputed_steps(run: Path) -> int:
    """Trainer steps of this run that were trained more than once (after a restart from an
    earlier checkpoint, the steps since it are trained again)."""
    counts = Counter(int(m["step"]) for m in read_metrics(run, "trainer"))
    return sum(count - 1 for count in counts.values())


def trained_steps(run: Path) -> list[int]:
    return sorted({int(m["step"]) for m in read_metrics(run, "trainer")})


def checkpoints_loaded(experiment: Path) -> list[tuple[str, Path]]:
    """(run id, checkpoint directory) for every resume the trainer logged."""
    log = layout.process_log_path(experiment, "trainer")
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [(run_id, Path(directory)) for run_id, directory in _RESUMED.findall(text)]


def incomplete_loaded(experiment: Path, planted: set[Path]) -> list[Path]:
    """Checkpoints the trainer loaded that were not complete: one we planted without
    STABLE, or one that is still there without STABLE."""
    bad = []
    for _, directory in checkpoints_loaded(experiment):
        if directory in planted or (directory.exists() and not layout.is_stable(directory)):
            bad.append(directory)
    return bad


def half_written(experiment: Path, planted: set[Path]) -> list[Path]:
    """Files and directories left half-written: temp names of atomic writes and staged
    directories (`.NAME.*.tmp`), and step directories without STABLE in their final place
    (rollouts, broadcasts, checkpoint parts), except those the benchmark planted itself."""
    found = list(experiment.rglob(".*.tmp"))
    for run in layout.list_run_dirs(experiment):
        steps = [
            *layout.list_step_dirs(layout.rollouts_dir(run)),
            *layout.list_step_dirs(layout.broadcasts_dir(run)),
        ]
        found += [path for _, path in steps if not layout.is_stable(path)]
        for _, step in layout.list_step_dirs(layout.checkpoints_dir(run)):
            parts = [p for p in step.iterdir() if p.is_dir() and not p.name.startswith(".")]
            found += [p for p in parts if not layout.is_stable(p)]
    return sorted(path for path in found if path not in planted)
