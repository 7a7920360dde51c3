"""The scheduler a recipe's `[sweep.scheduler]` names: ASHA's early stopping
(`workbench.sweep.scheduler`) or population-based training (`workbench.sweep.pbt_scheduler`),
started for the supervisor and described for logs and `workbench sweep plan`."""

from __future__ import annotations

from pathlib import Path

from workbench.sweep import pbt_scheduler
from workbench.sweep.pbt_scheduler import ForkRun, PopulationBasedTraining
from workbench.sweep.scheduler import EarlyStopping, Scheduler, describe
from workbench.sweep.spec import AshaSpec, PbtSpec, SweepSection


def start_scheduler(experiment: Path, spec: AshaSpec | PbtSpec, fork: ForkRun) -> Scheduler:
    """The supervisor's scheduler for the recipe's `[sweep.scheduler]`; `fork` makes PBT's
    exploits (the supervisor's `fork_run`, handed down so that sweeps import nothing of it)."""
    if isinstance(spec, PbtSpec):
        return PopulationBasedTraining.for_experiment(experiment, spec, fork)
    return EarlyStopping(experiment, spec)


def describe_scheduler(spec: AshaSpec | PbtSpec, sweep: SweepSection, max_steps: int) -> str:
    """One line for logs and `workbench sweep plan`, for either kind."""
    if isinstance(spec, PbtSpec):
        return pbt_scheduler.describe(spec, sweep, max_steps)
    return f"early stopping: {describe(spec, max_steps)}"
