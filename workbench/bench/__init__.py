"""Benchmarks behind `just bench` / `workbench bench`: timings live here, never in tests.

Each benchmark writes JSON under `benchmarks/results/` and prints a table.

Here too, outside the product, is what the benchmarks share with the tests: the stand-in
plan, small processes the supervisor runs in place of vLLM, torchrun and orchestrators
(`standins.py`, `standin_child.py`), and a vLLM server started without a supervisor
(`local_server.py`).
"""
