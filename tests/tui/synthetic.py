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


def write_supervisor_state(
    experiment: Path, supervisor_pid: int, processes: dict, startup: dict | None = None
) -> None:
    write_json(
        experiment / "supervisor" / "state.json",
        {
            "pid": supervisor_pid,
            "experiment": str(experiment),
            "started_at": iso(3 * 3600),
            "status": "running",
            "processes": processes,
            "startup": startup,
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


# ---------------------------------------------------------------- a sweep with early stopping

SWEEP_RECIPE = """\
[experiment]
name = "lr_sweep"

[model]
base = "builtin:tiny-reverse"

[defaults]
max_steps = 20
lr = 3e-3
lora = { rank = 4 }
eval = { interval = 5 }

[sweep]
grid.lr = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
grid."lora.rank" = [4, 8]

[sweep.scheduler]
kind = "asha"
grace_steps = 5
reduction_factor = 2
min_runs = 2
"""


STOPPED_EARLY_REASON = "asha rung 0 (step 5): eval_reward_mean 0.31 < cutoff 0.55, rank 3/3"


def eval_lines(points: list[tuple[int, float]]) -> list[dict]:
    """Eval records as the orchestrator's evaluation writes them, one per (step, value)."""
    return [
        {
            "source": "eval",
            "step": step,
            "policy_version": step,
            "time": FROZEN_NOW - 20 + step + 0.25,
            "eval_reward_mean": value,
            "eval_reward_std": 0.1,
            "eval_samples": 16,
        }
        for step, value in points
    ]


def rung_result(
    run_id: str, rung: int, value: float, rank: int, of: int, cutoff: float | None, decision: str
) -> dict:
    """One result of sweep/asha.json, as ASHA (grace 5, factor 2, min_runs 2) decided it."""
    step = 5 * 2**rung
    return {
        "run_id": run_id,
        "rung": rung,
        "step": step,
        "value": value,
        "rank": rank,
        "of": of,
        "cutoff": cutoff,
        "decision": decision,
        "reached_at": FROZEN_NOW - 20 + step,
        "action": "evicted" if decision == "stop" else None,
    }


def build_sweep_experiment(root: Path) -> Path:
    """A sweep's experiment part-way: runs ranked by eval_reward_mean under ASHA.

    | rank | run              | state                  | evals (step: value)                 |
    | 1    | run_lr1e-2_rank8 | active, rung 1         | 0: .30, 5: .55, 10: .70             |
    | 2    | run_lr3e-3_rank4 | finished, rung 1       | 0: .30, 5: .56, 10: .60, 20: .66    |
    | 3    | run_lr3e-4_rank4 | stopped early, rung 0  | 0: .30, 5: .31                      |
    | 4    | run_lr3e-2_rank8 | evicted by hand (tui)  | 0: .30                              |
    | 5    | run_lr1e-3_rank8 | waiting                | none                                |

    The trainer's and supervisor's pids are this test process, which is alive.
    """
    alive = os.getpid()
    experiment = root / "lr_sweep"
    experiment.mkdir(parents=True)
    (experiment / "recipe.toml").write_text(SWEEP_RECIPE, encoding="utf-8")
    runs = {
        "run_lr1e-2_rank8": (1e-2, 8, [(0, 0.30), (5, 0.55), (10, 0.70)], 11),
        "run_lr3e-3_rank4": (3e-3, 4, [(0, 0.30), (5, 0.56), (10, 0.60), (20, 0.66)], 21),
        "run_lr3e-4_rank4": (3e-4, 4, [(0, 0.30), (5, 0.31)], 6),
        "run_lr3e-2_rank8": (3e-2, 8, [(0, 0.30)], 4),
        "run_lr1e-3_rank8": (1e-3, 8, [], 1),
    }
    for run_id, (lr, rank, evals, steps) in runs.items():
        run = make_run(
            experiment,
            run_id,
            f"max_steps = 20\nlr = {lr:g}\nlora = {{ rank = {rank} }}\neval = {{ interval = 5 }}\n",
        )
        append_metrics(run, metrics_lines(1, steps, reward0=0.3, slope=lr) + eval_lines(evals))
        append_log(run / "logs" / "orchestrator.log", [f"{run_id} started"])
    (experiment / "run_lr3e-3_rank4" / "control" / "finished.txt").write_text("step: 20\n")
    stopped = experiment / "run_lr3e-4_rank4" / "control" / "evicted.txt"
    stopped.write_text(
        f"{STOPPED_EARLY_REASON}\nevicted_at: {iso(10)}\nevicted_by: asha\n", encoding="utf-8"
    )
    by_hand = experiment / "run_lr3e-2_rank8" / "control" / "evicted.txt"
    by_hand.write_text(f"loss diverged\nevicted_at: {iso(30)}\nevicted_by: tui\n")
    write_json(
        experiment / "sweep" / "asha.json",
        {
            "format": "workbench.asha",
            "version": 1,
            "spec": {
                "kind": "asha",
                "grace_steps": 5,
                "reduction_factor": 2,
                "metric": "eval_reward_mean",
                "mode": "max",
                "min_runs": 2,
            },
            "results": [
                rung_result("run_lr1e-2_rank8", 0, 0.55, 1, 1, None, "too_few"),
                rung_result("run_lr3e-3_rank4", 0, 0.56, 1, 2, 0.555, "continue"),
                rung_result("run_lr3e-4_rank4", 0, 0.31, 3, 3, 0.55, "stop"),
                rung_result("run_lr3e-3_rank4", 1, 0.60, 1, 1, None, "too_few"),
                rung_result("run_lr1e-2_rank8", 1, 0.70, 1, 2, 0.65, "continue"),
            ],
            "updated_at": iso(10),
        },
    )
    write_json(
        experiment / "trainer" / "runs.json",
        {
            "max_runs": 2,
            "pid": alive,
            "slots": {"0": "run_lr1e-2_rank8"},
            "progress": {"run_lr1e-2_rank8": {"step": 10, "total_tokens": 10000}},
            "waiting": ["run_lr1e-3_rank8"],
            "updated_at": iso(5),
        },
    )
    write_supervisor_state(experiment, alive, {})
    return experiment
