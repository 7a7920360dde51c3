"""A plan of stand-in children, described by `{experiment}/standins.json`: not for training.

The supervisor's tests and its benchmark (`workbench bench supervisor`) start the daemon
with `--plan workbench.testing.standins:plan` (`PLAN_REFERENCE`), so they run the real
daemon (own session, lock, socket, file watcher) around small Python stand-ins
(`standin_child.py`) instead of vLLM, torchrun and orchestrators. `standins.json`:

    {"processes": [{"name": "inference", "kind": "inference", "ready": true,
                    "args": ["--ready-after", "0.5"], "restart": {...}}, ...],
     "orchestrator": {"args": [...], "requires_ready": ["inference"], "restart": {...}}}

The recipe's `[sweep.scheduler]`, if any, turns on early stopping, and its `[tracking]`
experiment tracking, as in the real plan.

A process entry may give `argv` (a full command, e.g. `python -c ...`) instead of `args`,
and `module` to check, as the real plan does, that a module exists before starting. So
may the orchestrator entry: `"argv": [python, "-m", "workbench.orchestrator"]` runs the
real orchestrator (`--run-dir` is added) among stand-ins.
`ready: true` gives it a file readiness check on `{experiment}/ready/<name>`, which the
stand-in creates when passed `--ready-file` (added automatically).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from workbench.config import ConfigError
from workbench.files import layout
from workbench.recipe import load_recipe
from workbench.supervisor.plan import Plan, module_problem
from workbench.supervisor.policy import RestartPolicy
from workbench.supervisor.process import FileReady, ProcessSpec
from workbench.tracking import TrackingTarget

CHILD = Path(__file__).with_name("standin_child.py")
PLAN_REFERENCE = "workbench.testing.standins:plan"


def config_path(experiment: Path) -> Path:
    """`standins.json`: which stand-ins to run; without it, `DEFAULT_PROCESSES`."""
    return experiment / "standins.json"


def events_path(experiment: Path) -> Path:
    return experiment / "events.log"


def ready_path(experiment: Path, name: str) -> Path:
    return experiment / "ready" / name


def standin_argv(experiment: Path, name: str, args: list[str], ready: bool) -> list[str]:
    argv = [sys.executable, str(CHILD), "--name", name, "--events", str(events_path(experiment))]
    if ready:
        argv += ["--ready-file", str(ready_path(experiment, name))]
    return argv + [str(arg) for arg in args]


def _spec(experiment: Path, entry: dict[str, Any]) -> ProcessSpec:
    name = entry["name"]
    ready = bool(entry.get("ready"))
    argv = entry.get("argv") or standin_argv(experiment, name, entry.get("args", []), ready)
    return ProcessSpec(
        name=name,
        kind=entry.get("kind", "stand-in"),
        argv=argv,
        log_path=layout.process_log_path(experiment, name),
        readiness=FileReady(ready_path(experiment, name)) if ready else None,
        ready_timeout_s=entry.get("ready_timeout_s", 60.0),
        requires_ready=tuple(entry.get("requires_ready", ())),
        restart=RestartPolicy(**entry.get("restart", {})),
        stop_timeout_s=entry.get("stop_timeout_s", 5.0),
        preflight=_module_preflight(entry["module"]) if "module" in entry else None,
    )


def _module_preflight(module: str):
    return lambda: module_problem(module)


# Without standins.json: inference ready after 0.3 s, a trainer, and orchestrators that
# finish their run after 0.2 s, so `workbench up --headless` completes in seconds (for
# tests elsewhere that only need `up` to work: set WORKBENCH_SUPERVISOR_PLAN).
DEFAULT_PROCESSES: list[dict[str, Any]] = [
    {"name": "inference", "kind": "inference", "ready": True, "args": ["--ready-after", "0.3"]},
    {"name": "trainer", "kind": "trainer"},
]
DEFAULT_ORCHESTRATOR: dict[str, Any] = {"args": ["--finish-after", "0.2"]}


def plan(experiment: Path) -> Plan:
    if config_path(experiment).exists():
        config = json.loads(config_path(experiment).read_text())
    else:
        config = {"processes": DEFAULT_PROCESSES, "orchestrator": DEFAULT_ORCHESTRATOR}
    fixed = [_spec(experiment, entry) for entry in config.get("processes", [])]
    orchestrator = config.get("orchestrator", {})

    def orchestrator_spec(run_id: str, run_dir: Path) -> ProcessSpec:
        args = [*orchestrator.get("args", []), "--run-dir", str(run_dir)]
        if "argv" in orchestrator:
            argv = [*orchestrator["argv"], "--run-dir", str(run_dir)]
        else:
            argv = standin_argv(experiment, run_id, args, ready=False)
        return ProcessSpec(
            name=run_id,
            kind="orchestrator",
            run_id=run_id,
            argv=argv,
            log_path=layout.orchestrator_log_path(run_dir),
            requires_ready=tuple(orchestrator.get("requires_ready", ["inference"])),
            restart=RestartPolicy(**orchestrator.get("restart", {})),
            stop_timeout_s=orchestrator.get("stop_timeout_s", 5.0),
            own_session=False,  # as the real plan's orchestrators
        )

    early_stopping = tracking = None
    with contextlib.suppress(ConfigError):  # stand-ins need no recipe otherwise
        recipe = load_recipe(layout.recipe_path(experiment))
        early_stopping = recipe.sweep.scheduler if recipe.sweep is not None else None
        tracking = TrackingTarget.from_recipe(recipe)
    return Plan(
        processes=fixed,
        orchestrator=orchestrator_spec,
        notes=["stand-in plan"],
        early_stopping=early_stopping,
        tracking=tracking,
    )
