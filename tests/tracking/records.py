"""Records as runs write them, and what a tracker should then hold, for the tracking tests."""

from __future__ import annotations

from pathlib import Path

from tests.tracking.stores import trackio_logs
from workbench.files.metrics import append_metrics

Row = tuple[str, int, dict[str, float]]  # (source, step, values without the source prefix)


def write_steps(run: Path, steps: range) -> None:
    """Records as a run writes them: the orchestrator a step ahead of the trainer, an eval
    every other step, and one step dropped and retried (two orchestrator lines)."""
    for step in steps:
        append_metrics(run, "orchestrator", step + 1, reward_mean=step / 10, written=True)
        if step == 2:
            append_metrics(run, "orchestrator", step + 1, reward_mean=0.0, written=False)
        append_metrics(run, "trainer", step, loss=1.0 + step, adapter_note="no number")
        if step % 2 == 0:
            append_metrics(run, "eval", step, eval_reward_mean=step / 20)


def expected_rows(steps: range) -> list[Row]:
    """(source, step, values) of what `write_steps` wrote, in file order."""
    rows = []
    for step in steps:
        rows.append(
            ("orchestrator", step + 1, {"reward_mean": step / 10, "written": 1.0}),
        )
        if step == 2:
            rows.append(("orchestrator", step + 1, {"reward_mean": 0.0, "written": 0.0}))
        rows.append(("trainer", step, {"loss": 1.0 + step}))
        if step % 2 == 0:
            rows.append(("eval", step, {"eval_reward_mean": step / 20}))
    return rows


def trackio_rows(project: str, run: str) -> list[tuple[int, dict[str, float]]]:
    return [
        (row["step"], {k: v for k, v in row.items() if k not in ("step", "timestamp")})
        for row in trackio_logs(project, run)
    ]


def wandb_rows(history: list[dict]) -> list[Row]:
    """(source, step, values) of each wandb history row, read from its `<source>/step`."""
    rows = []
    for row in history:
        steps = [key for key in row if key.endswith("/step")]
        assert len(steps) == 1, row
        source = steps[0].removesuffix("/step")
        values = {
            key.removeprefix(f"{source}/"): value
            for key, value in row.items()
            if key.startswith(f"{source}/") and key != steps[0]
        }
        rows.append((source, row[steps[0]], values))
    return rows


def as_trackio(rows: list[Row]) -> list[tuple[int, dict]]:
    return [
        (step, {f"{source}/{k}": v for k, v in values.items()}) for source, step, values in rows
    ]
