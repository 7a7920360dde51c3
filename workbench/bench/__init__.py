"""Benchmarks behind `just bench` / `workbench bench`: timings live here, never in tests.

Each benchmark writes JSON under `benchmarks/results/` and prints a table. What the
benchmarks share with the tests (the stand-in children, a vLLM server started without a
supervisor) is in `workbench.testing`.

`cli` is the `workbench bench` sub-app; one module per benchmark: `e2e` (reward against
wall-clock time), `separate` with `separate_setup` and `seed_control` (N runs shared
against N experiments), `sweep`, `trainer` and `publishing`, `inference`, `prefill`,
`evaluation`, `env_speed` (a verifiers environment's episodes/s), `tinker` (Tinker clients at
once against one service), `discovery` (following
file events), `load/` (runs coming and going under the TUI) and `faults/` (injected
failures); `headless` runs `workbench up --headless` for them and `process_trees` watches
their processes' memory and CPU.
"""
