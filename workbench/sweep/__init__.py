"""Sweeps: a recipe's `[sweep]` table expanded into runs, and early stopping (ASHA).

- `spec`: the `[sweep]` table's pydantic models (grid, random distributions, repeats,
  scheduler).
- `expand`: the pure expansion into runs with readable ids, and its checks.
- `asha`: the pure early-stopping decision at each rung.
- `scheduler`: the supervisor's component that follows each run's metrics and evicts.
"""
