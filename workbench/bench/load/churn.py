"""The load: the shipped recipe with 16 short runs on 4 trainer slots (by default; `bench
load --runs N --slots S`), and runs coming and going every few seconds while it trains.

Each tick evicts one unfinished run (an active one or a queued one, by a seeded coin) and
then adds runs until 16 are unfinished again, so there are always 16 at once: 4 training,
12 waiting. Runs are added and evicted through the supervisor's control socket, the same
requests `workbench runs add` and `workbench evict` send (without a Python start-up per
command, which on two cores would be load of its own).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

import tomlkit

from workbench.config import default_max_loras
from workbench.files import layout, run_control
from workbench.status import read_trainer_state
from workbench.supervisor.client import SupervisorClient, SupervisorError

SHIPPED_RECIPE = Path("recipes/reverse_text.toml")
RUNS_AT_ONCE = 16
SLOTS = 4
# Short runs: 4 prompts x 8 completions a step, no held-out evals.
RUN_SETTINGS = {"max_steps": 8, "batch_size": 32, "eval": {"interval": 0}}
EVICTION_REASON = "load benchmark"


def load_recipe(
    shipped: Path = SHIPPED_RECIPE, runs_at_once: int = RUNS_AT_ONCE, slots: int = SLOTS
) -> str:
    """The shipped recipe as the load runs it: its model, task and settings, with
    `runs_at_once` short runs on `slots` slots (vLLM's adapters following), in
    `outputs/load`."""
    document = tomlkit.parse(shipped.read_text(encoding="utf-8"))
    document["experiment"]["name"] = "load"
    document["experiment"]["output_dir"] = "outputs/load"
    document["trainer"]["max_concurrent_runs"] = slots
    document.setdefault("inference", tomlkit.table())["max_loras"] = default_max_loras(slots)
    defaults = document["defaults"]
    for key, value in RUN_SETTINGS.items():
        defaults[key] = value
    runs = tomlkit.aot()
    for index in range(runs_at_once):
        run = tomlkit.table()
        run["id"] = initial_id(index)
        runs.append(run)
    document["runs"] = runs
    return tomlkit.dumps(document)


def initial_id(index: int) -> str:
    return f"load{index:02d}"


@dataclass
class ChurnLog:
    """What the churn did, for the report and the accounting."""

    added: list[str] = field(default_factory=list)  # every run id, the recipe's first
    evicted_active: list[str] = field(default_factory=list)
    evicted_waiting: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ticks: int = 0
    tick_s: list[float] = field(default_factory=list)  # how long each tick's requests took

    @property
    def evicted(self) -> list[str]:
        return [*self.evicted_active, *self.evicted_waiting]


class Churn:
    """Runs coming and going on a live experiment, in a thread, every `interval_s` (of the
    `background` process: never the TUI's)."""

    def __init__(
        self, experiment: Path, interval_s: float, rng: Random, runs_at_once: int = RUNS_AT_ONCE
    ) -> None:
        self.experiment = experiment
        self.interval_s = interval_s
        self.rng = rng
        self.runs_at_once = runs_at_once
        self.client = SupervisorClient(experiment)
        self.log = ChurnLog(added=[f"run_{initial_id(i)}" for i in range(runs_at_once)])
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_id = runs_at_once

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="churn", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            started = time.perf_counter()
            try:
                self.tick()
            except Exception as err:  # one bad tick is a line of the report, not the end
                self.log.errors.append(f"tick {self.log.ticks}: {type(err).__name__}: {err}")
            self.log.tick_s.append(time.perf_counter() - started)

    def unfinished(self) -> list[str]:
        evicted = set(self.log.evicted)
        return [
            run_id
            for run_id in self.log.added
            if run_id not in evicted
            and not run_control.is_finished(layout.run_dir(self.experiment, run_id))
        ]

    def tick(self) -> None:
        self.log.ticks += 1
        unfinished = self.unfinished()
        slots = (read_trainer_state(self.experiment) or {}).get("slots", {})
        active = [run_id for run_id in unfinished if run_id in slots.values()]
        waiting = [run_id for run_id in unfinished if run_id not in slots.values()]
        victim = choose_eviction(active, waiting, self.rng)
        if victim is not None:
            self.evict(victim, victim in active)
            unfinished.remove(victim)
        for _ in range(max(1, self.runs_at_once - len(unfinished))):
            self.add()

    def evict(self, run_id: str, was_active: bool) -> None:
        try:
            self.client.evict(run_id, EVICTION_REASON)
        except SupervisorError as err:
            self.log.errors.append(f"evict {run_id}: {err}")
            return
        (self.log.evicted_active if was_active else self.log.evicted_waiting).append(run_id)

    def add(self) -> None:
        name = f"add{self._next_id:03d}"
        self._next_id += 1
        try:
            reply = self.client.add_run(name)
        except SupervisorError as err:
            self.log.errors.append(f"add {name}: {err}")
            return
        self.log.added.append(str(reply["run_id"]))


def choose_eviction(active: list[str], waiting: list[str], rng: Random) -> str | None:
    """An active run or a waiting one, even odds when both exist: evicting active runs frees
    slots, evicting waiting ones takes runs out of the queue."""
    pools = [pool for pool in (active, waiting) if pool]
    if not pools:
        return None
    return rng.choice(rng.choice(pools))
