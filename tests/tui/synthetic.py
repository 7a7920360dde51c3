"""A synthetic experiment directory, as the supervisor, trainer and orchestrators leave it.

Nothing runs: the files are written the way docs/contracts.md describes them, so the TUI
can be tested against every state a run can be in, deterministically. Times are relative
to `FROZEN_NOW`, the clock the tests give the app.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

FROZEN_NOW = 1_790_000_000.0  # a fixed "now" for ages and uptimes


def iso(seconds_before_now: float) -> str:
    moment = dt.datetime.fromtimestamp(FROZEN_NOW - seconds_before_now, tz=dt.UTC)
    return moment.isoformat(timespec="seconds")


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def make_run(experiment: Path, run_id: str, orch_toml: str = "max_steps = 30\n") -> Path:
    run = experiment / run_id
    (run / "control").mkdir(parents=True, exist_ok=True)
    (run / "control" / "orch.toml").write_text(orch_toml, encoding="utf-8")
    return run


def metrics_lines(start: int, stop: int, *, reward0: float, slope: float) -> list[dict]:
    """Orchestrator and trainer lines for steps [start, stop), reward rising by `slope`."""
    lines = []
    for step in range(start, stop):
        when = FROZEN_NOW - 20 + step  # step 12 lands 8 s before "now"
        reward = min(1.0, reward0 + slope * step)
        lines.append(
            {
                "source": "orchestrator",
                "step": step,
                "time": when,
                "reward_mean": reward,
                "reward_std": 0.1,
                "reward_min": 0.0,
                "reward_max": 1.0,
            }
        )
        lines.append(
            {
                "source": "trainer",
                "step": step,
                "time": when + 0.5,
                "loss": 1.0 / (step + 1),
                "grad_norm": 0.5,
                "lr": 3e-4,
                "tokens": 1000,
                "samples": 64,
            }
        )
    return lines


def append_metrics(run: Path, lines: list[dict]) -> None:
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line) + "\n")


def append_log(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))


def process(
    name: str,
    kind: str,
    state: str,
    pid: int,
    started: float,
    restarts: int = 0,
    run_id: str | None = None,
    exits: list[dict] | None = None,
) -> dict:
    return {
        "name": name,
        "kind": kind,
        "run_id": run_id,
        "state": state,
        "pid": pid,
        "restarts": restarts,
        "started_at": iso(started),
        "log": "",
        "exits": exits or [],
    }


def write_supervisor_state(experiment: Path, supervisor_pid: int, processes: dict) -> None:
    write_json(
        experiment / "supervisor" / "state.json",
        {
            "pid": supervisor_pid,
            "experiment": str(experiment),
            "started_at": iso(3 * 3600),
            "status": "running",
            "processes": processes,
        },
    )


def build_experiment(root: Path, supervisor_pid: int | None = None) -> Path:
    """Four runs (active, active, waiting, rejected), a trainer, a supervisor, logs.

    The trainer's and supervisor's pid default to this test process, which is alive, so
    the state files count as current.
    """
    alive = os.getpid()
    experiment = root / "reverse_text"
    experiment.mkdir(parents=True)
    (experiment / "recipe.toml").write_text('[experiment]\nname = "reverse_text"\n')

    fast = make_run(experiment, "run_lr1e-3", "max_steps = 30\nlr = 1e-3\n")
    append_metrics(fast, metrics_lines(1, 13, reward0=0.3, slope=0.04))
    append_log(
        fast / "logs" / "orchestrator.log",
        [f"step {s}: reward 0.{30 + 4 * s:02d}" for s in range(1, 13)],
    )
    slow = make_run(experiment, "run_lr3e-4", "max_steps = 30\nlr = 3e-4\n")
    append_metrics(slow, metrics_lines(1, 9, reward0=0.3, slope=0.01))
    append_log(slow / "logs" / "orchestrator.log", ["starting", "step 1 done"])
    make_run(experiment, "run_queued")
    bad = make_run(experiment, "run_typo", "max_step = 30\n")
    (bad / "control" / "config_validation_error.txt").write_text(
        "run_typo/control/orch.toml, line 1: [max_step] unknown key; did you mean max_steps?\n"
    )

    write_json(
        experiment / "trainer" / "runs.json",
        {
            "max_runs": 2,
            "pid": alive,
            "slots": {"0": "run_lr1e-3", "1": "run_lr3e-4"},
            "progress": {
                "run_lr1e-3": {"step": 12, "total_tokens": 12000, "total_samples": 768},
                "run_lr3e-4": {"step": 8, "total_tokens": 8000, "total_samples": 512},
            },
            "waiting": ["run_queued"],
            "updated_at": iso(5),
        },
    )
    write_supervisor_state(
        experiment,
        supervisor_pid if supervisor_pid is not None else alive,
        {
            "inference": process("inference", "inference", "ready", 4101, 3 * 3600 - 5),
            "trainer": process(
                "trainer",
                "trainer",
                "running",
                4102,
                2 * 3600,
                restarts=1,
                exits=[{"time": iso(2 * 3600), "code": 1, "signal": None, "last_lines": []}],
            ),
            "run_lr1e-3": process(
                "run_lr1e-3", "orchestrator", "running", 4103, 700, run_id="run_lr1e-3"
            ),
            "run_lr3e-4": process(
                "run_lr3e-4", "orchestrator", "running", 4104, 42, run_id="run_lr3e-4"
            ),
        },
    )
    append_log(experiment / "logs" / "trainer.log", ["trainer up", "step 12 run_lr1e-3"])
    append_log(experiment / "logs" / "inference.log", ["INFO: vLLM ready"])
    append_log(experiment / "logs" / "supervisor.log", ["supervisor started"])
    return experiment
