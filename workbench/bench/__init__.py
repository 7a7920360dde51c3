"""Benchmarks behind `just bench` / `workbench bench`: timings live here, never in tests.

Each benchmark writes JSON under `benchmarks/results/` and prints a table.
"""
