"""Benchmarks behind `just bench` / `workbench bench`: timings live here, never in tests.

Each benchmark writes JSON under `benchmarks/results/` and prints a table. What the
benchmarks share with the tests (the stand-in children, a vLLM server started without a
supervisor) is in `workbench.testing`.
"""
