"""`workbench bench ...`: the benchmark commands (a Typer sub-app of the main CLI)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

bench_app = typer.Typer(
    name="bench",
    help="Benchmarks: results as JSON under benchmarks/results/ and a printed table.",
    no_args_is_help=True,
)


def _split_ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


@bench_app.command("trainer")
def trainer(
    models: Annotated[
        str, typer.Option(help="Model shapes, comma separated: tiny, qwen3-0.6b.")
    ] = ("tiny,qwen3-0.6b"),
    runs: Annotated[str, typer.Option(help="Run counts N, comma separated.")] = "1,2,4,8",
    steps: Annotated[int, typer.Option(min=1, help="Measured updates per configuration.")] = 3,
) -> None:
    """One trainer training N runs vs N separate trainers vs peft, same total tokens.

    Reports tokens/s (median update time) and peak memory (RSS on CPU, CUDA allocator peak
    on a GPU) for N = 1, 2, 4, 8 on the built-in tiny model's shape and a Qwen3-0.6B shape
    with random weights.
    """
    from workbench.bench.results import write_result
    from workbench.bench.trainer import print_table, run_benchmark

    measurements = run_benchmark([m.strip() for m in models.split(",")], _split_ints(runs), steps)
    print_table(measurements)
    path = write_result("trainer", {"measurements": [asdict(m) for m in measurements]})
    typer.echo(f"results: {path}")
