"""The supervisor's population-based training: follow the runs, ask PBT, fork and evict.

`PopulationBasedTraining.poll` runs on the supervisor's loop (at most once a second), as
early stopping's does (`workbench.sweep.scheduler`). It reads what each run's
`metrics.jsonl` gained, what it keeps of checkpoints and its settings, lets
`workbench.sweep.pbt.decide` decide, and writes every new decision to `sweep/pbt.json`
before acting on it. An exploit is carried out in two acts, each written down once done:

1. the fork: `workbench runs fork SOURCE@STEP NEW` with the perturbed settings (the
   same code, `workbench.supervisor.fork.fork_run`, handed to the scheduler), whose `orch.toml` takes the loser's
   modification time, so the trainer (which admits waiting runs oldest config first)
   gives it the next free slot: the loser's, once it leaves;
2. the loser's eviction, returned to the supervisor, which evicts through its one path
   (`evicted.txt` names `pbt` and the decision's reason) and reports back with `evicted`.

A supervisor that restarts reads the file: decisions stand, and an exploit half carried
out is finished (a fork already there is not made twice). A fork that cannot be made (the
source's checkpoint was pruned meanwhile, or its settings do not validate) is written down
with why, and the loser goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from workbench.config import ConfigError, load_orchestrator_config
from workbench.files import layout, run_control
from workbench.files.metrics import parse_record
from workbench.sweep.asha import MetricPoint
from workbench.sweep.checks import Param, read_params
from workbench.sweep.files import PbtRecord, read_pbt, write_pbt
from workbench.sweep.pbt import Member, PbtDecision, decide
from workbench.sweep.pbt_checks import perturbed_params
from workbench.sweep.scheduler import POLL_INTERVAL_S, EarlyEviction, metric_point
from workbench.sweep.spec import PbtSpec, SweepSection
from workbench.sweep.values import flatten_values
from workbench.system.file_tail import AppendedLines

log = logging.getLogger("workbench.supervisor")

EVICTED_BY = "pbt"


@dataclass
class _FollowedRun:
    """One run as read so far: its metric's points, and its settings while orch.toml is
    unchanged."""

    metrics: AppendedLines
    points: list[MetricPoint] = field(default_factory=list)
    config_signature: tuple[int, int] | None = None
    config: tuple[int, int, dict[str, Any]] | None = None  # max_steps, start, settings


class ForkRun(Protocol):
    """Makes run `new_run` of `experiment` from `source` ("run@step") with `overrides`,
    admitted as if it were `admit_as`; raises `ForkFailed` (or a subclass) when it cannot
    (`workbench.supervisor.fork.fork_run`)."""

    def __call__(
        self,
        experiment: Path,
        source: str,
        new_run: str,
        overrides: dict[str, Any],
        *,
        admit_as: Path | None = None,
    ) -> object: ...


class ForkFailed(Exception):
    """A fork that could not be made; the message says why."""


class SourcePruned(ForkFailed):
    """The source's checkpoint of the asked step went (pruned by the trainer) before or
    while the fork copied it; a newer one of the same run is there to fork instead."""


class PopulationBasedTraining:
    def __init__(
        self,
        experiment: Path,
        spec: PbtSpec,
        params: dict[str, Param],
        seed: int = 0,
        *,
        fork: ForkRun,
        interval_s: float = POLL_INTERVAL_S,
    ):
        self.experiment = Path(experiment)
        self.fork = fork
        self.spec = spec
        self.params = params  # the keys PBT perturbs, with their [sweep] values
        self.seed = seed
        self.interval_s = interval_s
        self.evicted_by = EVICTED_BY
        self._runs: dict[str, _FollowedRun] = {}
        self._next_poll = 0.0
        self.record = self._load()

    @classmethod
    def for_experiment(
        cls, experiment: Path, spec: PbtSpec, fork: ForkRun
    ) -> PopulationBasedTraining:
        """PBT over the runs of `experiment`, perturbing the keys its recipe's [sweep] varies."""
        # Back up the floors, at call time: the recipe loader expands sweeps with this
        # package, and PBT needs the whole [sweep] section of the running experiment.
        from workbench.recipe import load_recipe

        sweep = load_recipe(layout.recipe_path(experiment)).sweep
        if sweep is None:
            return cls(experiment, spec, {}, fork=fork)
        return cls(experiment, spec, swept_params(spec, sweep), sweep.seed, fork=fork)

    def _load(self) -> PbtRecord:
        record = read_pbt(self.experiment)
        if record is None or record.spec != self.spec:
            if record is not None:
                log.warning("pbt settings changed: earlier decisions are set aside")
            return PbtRecord(self.spec, [], {})
        return record

    # ---------------------------------------------------------------- each tick

    def poll(self, now: float) -> list[EarlyEviction]:
        """Losers to evict, their forks written (at most every `interval_s` of `now`)."""
        if now < self._next_poll:
            return []
        self._next_poll = now + self.interval_s
        runs = layout.list_run_dirs(self.experiment)
        members = [member for member in map(self._member, runs) if member is not None]
        new = decide(self.record.decisions, members, self.spec, self.params, self.seed)
        for decision in new:
            log.info("%s: %s", decision.run_id, decision.reason(self.spec.metric, self.spec.mode))
        self.record.decisions.extend(new)
        if new:
            write_pbt(self.experiment, self.record)  # decisions are on disk before any act
        evictions = self._carry_out()
        return evictions

    def evicted(self, eviction: EarlyEviction) -> None:
        """The supervisor evicted the run an exploit replaced."""
        self.record.actions[(eviction.run_id, eviction.rung)] = "evicted"
        write_pbt(self.experiment, self.record)

    def _carry_out(self) -> list[EarlyEviction]:
        """Forks to write and evictions due for exploits not carried out yet."""
        due = []
        changed = False
        for decision in self.record.decisions:
            key = (decision.run_id, decision.step)
            action = self.record.actions.get(key)
            if decision.decision != "exploit" or action not in (None, "forked"):
                continue
            loser = layout.run_dir(self.experiment, decision.run_id)
            if action is None and run_control.is_finished(loser):
                action = self.record.actions[key] = "finished"  # no place left to take
                changed = True
            if action is None:
                action = self.record.actions[key] = self._fork(decision)
                changed = True
            if action != "forked":
                continue
            if run_control.read_eviction(loser) is not None:
                self.record.actions[key] = "already evicted"
                changed = True
            elif run_control.is_finished(loser):
                self.record.actions[key] = "finished"
                changed = True
            else:
                reason = decision.reason(self.spec.metric, self.spec.mode)
                due.append(EarlyEviction(decision.run_id, decision.step, reason))
        if changed:
            write_pbt(self.experiment, self.record)
        return due

    def _fork(self, decision: PbtDecision) -> str:
        """Write the exploit's fork; its action: "forked", or why it was not."""
        assert decision.new_run is not None
        if layout.run_dir(self.experiment, decision.new_run).exists():
            return "forked"  # made before a restart
        loser = layout.run_dir(self.experiment, decision.run_id)
        overrides = {key: new for key, (_, new) in decision.changes.items()}
        source = f"{decision.source}@{decision.source_step}"
        try:
            try:
                self.fork(
                    self.experiment,
                    source,
                    decision.new_run,
                    overrides,
                    admit_as=layout.orch_config_path(loser),
                )
            except SourcePruned as err:
                # The winner trains on and prunes as it goes: its newest checkpoint is as
                # good a source (its lineage in the fork's `forked_from` names the step).
                log.info("%s: %s; forking its newest checkpoint instead", decision.run_id, err)
                self.fork(
                    self.experiment,
                    decision.source,
                    decision.new_run,
                    overrides,
                    admit_as=layout.orch_config_path(loser),
                )
        except ForkFailed as err:
            log.warning("%s: pbt could not fork %s: %s", decision.run_id, decision.source, err)
            return f"fork failed: {err}"
        log.info(
            "%s: pbt forked %s@%s into %s",
            decision.run_id,
            decision.source,
            decision.source_step,
            decision.new_run,
        )
        return "forked"

    # ---------------------------------------------------------------- reading a run

    def _member(self, run: Path) -> Member | None:
        followed = self._runs.get(run.name)
        if followed is None:
            followed = self._runs[run.name] = _FollowedRun(AppendedLines(layout.metrics_path(run)))
        self._read_new_records(followed)
        config = self._config(run, followed)
        if config is None:
            return None  # no valid orch.toml: not a run the trainer would take
        max_steps, start, settings = config
        return Member(
            run_id=run.name,
            points=tuple(followed.points),
            max_steps=max_steps,
            start_step=start,
            in_race=run_control.read_eviction(run) is None,
            kept_steps=tuple(layout.checkpoint_steps(run, "trainer")),
            settings=settings,
        )

    def _read_new_records(self, followed: _FollowedRun) -> None:
        restarts = followed.metrics.restarts
        lines = followed.metrics.read()
        if followed.metrics.restarts != restarts:
            followed.points.clear()  # a new or truncated file: read afresh
        for line in lines:
            record = parse_record(line)
            if record is None or not isinstance(record.get("step"), int):
                continue
            point = metric_point(record, self.spec.metric)
            if point is not None:
                followed.points.append(point)

    def _config(self, run: Path, followed: _FollowedRun) -> tuple[int, int, dict[str, Any]] | None:
        path = layout.orch_config_path(run)
        try:
            stat = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        signature = (stat.st_mtime_ns, stat.st_size)
        if signature != followed.config_signature:
            followed.config_signature = signature
            try:
                config = load_orchestrator_config(path)
            except (ConfigError, OSError):
                followed.config = None
            else:
                values = flatten_values(config.model_dump(mode="json"))
                settings = {key: values.get(key) for key in self.params}
                start = config.forked_from.step if config.forked_from is not None else 0
                followed.config = (config.max_steps, start, settings)
        return followed.config


def swept_params(spec: PbtSpec, sweep: SweepSection) -> dict[str, Param]:
    """The keys PBT perturbs in this [sweep], with their values or distributions."""
    grid, sampled, _ = read_params(sweep.model_dump(mode="json"), None, None)
    return perturbed_params(spec, grid + sampled)


def describe(spec: PbtSpec, sweep: SweepSection, max_steps: int) -> str:
    """One line for logs and `workbench sweep plan`: what is ranked, when, what changes."""
    perturbed = list(swept_params(spec, sweep)) or ["nothing"]
    steps = spec.judged_steps(max_steps)
    where = ", ".join(str(s) for s in steps) if steps else f"none below max_steps {max_steps}"
    factors = "/".join(f"{f:g}" for f in spec.factors)
    return (
        f"pbt on {spec.metric} ({spec.mode}) at steps {where}: a run in the bottom "
        f"{spec.quantile:.0%} takes the checkpoint of one in the top {spec.quantile:.0%} and "
        f"perturbs {', '.join(perturbed)} (x{factors}, or resampled with probability "
        f"{spec.resample_probability:g}), once {spec.min_runs} runs are ranked"
    )


def exploit_lines(experiment: Path) -> list[str]:
    """Each exploit of `sweep/pbt.json` as a line for `sweep report`: the run, its reason and
    what was done about it; empty without PBT."""
    record = read_pbt(experiment)
    if record is None:
        return []
    lines = []
    for decision in record.decisions:
        if decision.decision == "exploit":
            action = record.actions.get((decision.run_id, decision.step), "not carried out yet")
            reason = decision.reason(record.spec.metric, record.spec.mode)
            lines.append(f"{decision.run_id}: {reason} [{action}]")
    return lines
