"""Sweeps: a recipe's `[sweep]` table expanded into runs, early stopping (ASHA) or
population-based training (PBT), reports.

The recipe loader (`workbench.recipe`) calls `expand.plan_sweep` once per load and keeps
the runs; nothing in this package imports the recipe back.

- `spec`: the `[sweep]` table's pydantic models (grid, random distributions, repeats,
  scheduler).
- `checks`: the table's keys, values and rules checked against the orchestrator's config.
- `expand`: the pure expansion into runs (`PlannedRun`), in admission order.
- `ids`, `values`: run ids made of swept values; dotted keys and how values read.
- `files`: `sweep/plan.json` and `sweep/asha.json` in the experiment directory.
- `asha`: the pure early-stopping decision at each rung.
- `scheduler`: the supervisor's component that follows each run's metrics and evicts.
- `pbt`, `pbt_checks`, `pbt_scheduler`: population-based training's pure decisions, what
  it needs of the recipe, and the supervisor's component that forks and evicts.
- `schedulers`: the scheduler a `[sweep.scheduler]` names (ASHA or PBT), started for the
  supervisor.
- `fit`, `report`: a sigmoid fit of each run's eval curve; the runs ranked once they ran.
- `compare`: runs of several experiments ranked together (`workbench compare`).
- `compare`: the runs of several experiments ranked (and drawn) together, by base model
  and environment.
"""
