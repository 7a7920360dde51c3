"""`workbench bench ...`: the benchmark commands (a Typer sub-app of the main CLI).

`workbench bench all` (what `just bench` runs) runs every benchmark, one after the other,
and prints one summary table; each benchmark also writes its own JSON under
`benchmarks/results/`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from workbench.bench.results import RESULTS_DIR

if TYPE_CHECKING:
    from workbench.bench.supervisor import SupervisorBenchSettings

bench_app = typer.Typer(
    name="bench",
    help="Benchmarks: results as JSON under benchmarks/results/ and a printed table.",
    no_args_is_help=True,
)


def _split_ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


# `bench trainer`'s longer options, named once here so its signature reads as a list.
PresetOption = Annotated[
    str | None,
    typer.Option(
        help="anchor: the GPU anchor (Qwen3-0.6B shape, rank 16, 16,384 tokens in one "
        "row, 512-token samples, N = 1, 4, 8); cpu-vocab: Qwen's vocabulary on a small "
        "body, 4 runs x 2,048 tokens in one 8,192-token row. Other options override it."
    ),
]
LegacyOption = Annotated[
    bool,
    typer.Option(
        help="Also measure the legacy compute (dense mask, full logits, one row at a time)."
    ),
]
RanksOption = Annotated[
    int,
    typer.Option(
        min=1,
        help="Trainer ranks under torchrun. Above 1, each N is measured with the base "
        "replicated and sharded (FSDP2) instead of the other modes.",
    ),
]
LossesOption = Annotated[
    str,
    typer.Option(
        help="Loss kinds, comma separated (e.g. ppo,gspo,cispo,is; kind+kl adds a k3 KL "
        "term to the base). Two or more: each N is measured with every run of the first "
        "(uniform) and with them in turn (mixed), alternately, instead of the other "
        "modes; `vs uniform` is their ratio.",
    ),
]
PublishingOption = Annotated[
    str,
    typer.Option(
        help="also, only or off: the time and bytes of publishing every run's adapter "
        "after an update (written as the trainer does, loaded with vLLM's loader; "
        "synthetic adapters of each shape, rank 8 for tiny and 16 for qwen3-0.6b unless "
        "--rank), at each N.",
    ),
]

ModelsOption = Annotated[
    str, typer.Option(help="Model shapes, comma separated: tiny, qwen3-vocab, qwen3-0.6b.")
]
AttentionOption = Annotated[
    str, typer.Option(help="auto, per_sample, varlen, flash, flex or dense.")
]
CheckpointingOption = Annotated[str, typer.Option(help="auto (on CUDA), on or off.")]
LogprobChunkOption = Annotated[int, typer.Option(min=0, help="LM head chunk; 0: full logits.")]
RowThreadsOption = Annotated[
    str, typer.Option(help="CPU: rows computed at once, one per thread; auto or a count.")
]


@bench_app.command("trainer")
def trainer(
    models: ModelsOption = "tiny,qwen3-0.6b",
    runs: Annotated[str, typer.Option(help="Run counts N, comma separated.")] = "1,2,4,8",
    steps: Annotated[int, typer.Option(min=1, help="Measured updates per configuration.")] = 3,
    preset: PresetOption = None,
    tokens: Annotated[int | None, typer.Option(min=1, help="Tokens per update.")] = None,
    seq_len: Annotated[int | None, typer.Option(min=16, help="Tokens per packed row.")] = None,
    sample_len: Annotated[int | None, typer.Option(min=2, help="Tokens per sample.")] = None,
    rank: Annotated[int | None, typer.Option(min=1, help="LoRA rank (alpha = 2 x rank).")] = None,
    attention: AttentionOption = "auto",
    activation_checkpointing: CheckpointingOption = "auto",
    logprob_chunk_tokens: LogprobChunkOption = 1024,
    compile: Annotated[bool, typer.Option(help="torch.compile each decoder layer.")] = False,
    row_threads: RowThreadsOption = "auto",
    legacy: LegacyOption = True,
    separate: Annotated[bool, typer.Option(help="Also measure N separate trainers.")] = True,
    peft: Annotated[bool, typer.Option(help="Also measure peft with one adapter.")] = True,
    ranks: RanksOption = 1,
    losses: LossesOption = "",
    publishing: PublishingOption = "also",
) -> None:
    """One trainer training N runs vs N separate trainers vs peft, same total tokens.

    Reports tokens/s (median update time), the memory of the measured updates, warm-up
    excluded (the CUDA allocator's peak allocated and reserved on a GPU; peak RSS and the
    RSS the updates added on the CPU), MFU on a GPU, which LoRA compute ran (grouped
    matmul, or the per-run loop and why), and each shared measurement's ratio to peft and
    to N separate trainers, whose steps start together. The "legacy" rows run the compute
    of earlier releases side by side (the "before"). A configuration that runs out of
    memory is a row saying OOM; the others still run. With --ranks above 1 the trainer runs
    under torchrun and each N is measured with the base replicated on every rank and
    sharded over them, with the frozen weights one rank holds.

    Publishing (--publishing): per shape and N, the seconds to copy every run's adapter
    out after an update (what the next update waits for), to write the copies (on
    background threads, as the trainer's master does), and to read them with vLLM's
    loader; the bytes of one adapter.
    """
    from workbench.bench.results import write_result

    compute = _compute_options(
        attention, activation_checkpointing, logprob_chunk_tokens, compile, row_threads
    )
    chosen = {"steps": steps, "compute": compute, "legacy": legacy, "separate": separate}
    chosen |= {"peft": peft, "ranks": ranks}
    given = {"tokens": tokens, "seq_len": seq_len, "sample_len": sample_len, "rank": rank}
    chosen |= {key: value for key, value in given.items() if value is not None}
    chosen["losses"] = _loss_names(losses)
    settings = _trainer_settings(preset, models, runs, chosen)
    if publishing not in ("also", "only", "off"):
        raise typer.BadParameter("choose also, only or off", param_hint="--publishing")
    payload = _measure_trainer(settings, preset, publishing, rank)
    path = write_result("trainer", payload)
    typer.echo(f"results: {path}")


def _measure_trainer(settings, preset: str | None, publishing: str, rank: int | None) -> dict:
    """`bench trainer`'s measurements (printed as a table) and, unless off, publishing's."""
    from workbench.bench.trainer import print_table, run_benchmark

    measurements = [] if publishing == "only" else run_benchmark(settings)
    if measurements:
        print_table(measurements)
    payload = {"preset": preset, "measurements": [asdict(m) for m in measurements]}
    if publishing != "off":
        from workbench.bench.publishing import run_publishing

        payload["publishing"] = run_publishing(
            settings.models, settings.run_counts, rank, settings.steps
        )
    return payload


def _compute_options(
    attention: str,
    activation_checkpointing: str,
    logprob_chunk_tokens: int,
    compile: bool,
    row_threads: str,
) -> dict:
    """The trainer's compute knobs from the command line, or `typer.BadParameter`."""
    checkpointing = {"auto": "auto", "on": True, "off": False}.get(activation_checkpointing)
    if checkpointing is None:
        raise typer.BadParameter("choose auto, on or off", param_hint="--activation-checkpointing")
    if row_threads != "auto" and not (row_threads.isdigit() and int(row_threads) >= 1):
        raise typer.BadParameter("choose auto or a count of 1 or more", param_hint="--row-threads")
    return {
        "attention": attention,
        "activation_checkpointing": checkpointing,
        "logprob_chunk_tokens": logprob_chunk_tokens,
        "compile": compile,
        "row_threads": row_threads if row_threads == "auto" else int(row_threads),
    }


def _loss_names(losses: str) -> list[str]:
    """`--losses` as a list, each name checked as a run's loss would be, or
    `typer.BadParameter` naming the bad one."""
    from pydantic import ValidationError

    from workbench.bench.trainer import bench_loss

    names = [name.strip() for name in losses.split(",") if name.strip()]
    for name in names:
        try:
            bench_loss(name)
        except ValidationError as err:
            message = err.errors()[0]["msg"].removeprefix("Value error, ")
            raise typer.BadParameter(message, param_hint="--losses") from None
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--losses") from None
    return names


def _trainer_settings(preset: str | None, models: str, runs: str, chosen: dict):
    """The benchmark's settings: a preset with the options given over it, or the model and
    run lists; a bad combination is a `typer.BadParameter`."""
    from workbench.bench.trainer import BenchSettings

    try:
        if preset:
            return BenchSettings.from_preset(preset, **chosen)
        model_list = [m.strip() for m in models.split(",") if m.strip()]
        return BenchSettings(models=model_list, run_counts=_split_ints(runs), **chosen)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


@bench_app.command("inference")
def inference(
    quick: Annotated[
        bool, typer.Option(help="A smaller workload and fewer repetitions (minutes less).")
    ] = False,
) -> None:
    """Completion tokens/s of one vLLM server serving 1, 2, 4 and 8 LoRA adapters vs the base.

    Starts one server on the built-in tiny model (float32, rank-8 LoRA, --max-loras 8),
    loads eight random adapters and sends the same reverse_text prompts to the base model,
    to one adapter, and round-robin to 2, 4 and 8 adapters at once. Reports the median
    over repetitions and the ratio to the base model, plus server startup time.
    """
    from workbench.bench.inference import run_inference_benchmark

    report = run_inference_benchmark(quick=quick)
    typer.echo(f"results: {report['path']}")


@bench_app.command("prefill")
def prefill(
    quick: Annotated[
        bool, typer.Option(help="One server of each kind instead of two (minutes less).")
    ] = False,
) -> None:
    """Seeded sampling over long prompts on vLLM's CPU build: split prefills with workbench's
    generator rewind against never splitting a prefill (--no-enable-chunked-prefill).

    Wall time of one step's worth of letter_count prompts and of 300-letter texts (16
    prompts x 8 seeded completions), median over passes on servers started alternately,
    and whether both ways give each seeded request the same tokens.
    """
    from workbench.bench.prefill import run_prefill_benchmark

    report = run_prefill_benchmark(quick=quick)
    typer.echo(f"results: {report['path']}")


@bench_app.command("supervisor")
def supervisor(
    quick: Annotated[
        bool, typer.Option("--quick", help="Fewer trials, shorter idle, two log rates.")
    ] = False,
    trials: Annotated[
        int | None, typer.Option(min=1, help="Discovery samples per way of creating a run.")
    ] = None,
    idle_seconds: Annotated[
        float | None, typer.Option(min=0.5, help="How long the TUI is left idle.")
    ] = None,
    log_rates: Annotated[
        str | None, typer.Option(help="Offered log lines/s, comma separated, increasing.")
    ] = None,
    log_seconds: Annotated[
        float | None, typer.Option(min=0.5, help="How long each log rate is written.")
    ] = None,
    tmux: Annotated[
        bool, typer.Option(help="Also measure the idle TUI in a real terminal (tmux).")
    ] = True,
    results_dir: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS_DIR,
    workdir: Annotated[
        Path | None,
        typer.Option(
            help="Create the experiments here and keep them (to read their logs); "
            "default: a temporary directory, removed afterwards."
        ),
    ] = None,
) -> None:
    """Discovery latency of a new run directory, TUI idle CPU with 8 runs, log throughput.

    A real supervisor runs the stand-in plan of the supervisor tests (tiny processes instead
    of vLLM, trainer and orchestrators; `workbench/testing/standins.py`), so what is timed is
    the supervisor and the TUI themselves. About two minutes; --quick about half a minute.
    """
    from workbench.bench.supervisor import SupervisorBenchSettings

    base = SupervisorBenchSettings.quick() if quick else SupervisorBenchSettings()
    settings = SupervisorBenchSettings(
        trials=trials or base.trials,
        idle_s=idle_seconds or base.idle_s,
        log_rates=tuple(_split_ints(log_rates)) if log_rates else base.log_rates,
        log_seconds=log_seconds or base.log_seconds,
        tmux=tmux and base.tmux,
    )
    _run_supervisor_benchmark(settings, results_dir, workdir)


def _run_supervisor_benchmark(
    settings: SupervisorBenchSettings,
    results_dir: Path = RESULTS_DIR,
    workdir: Path | None = None,
) -> dict[str, Any]:
    from workbench.bench.results import write_result
    from workbench.bench.supervisor import print_table, run_supervisor_benchmark

    payload = run_supervisor_benchmark(settings, workdir=workdir)
    print_table(payload)
    path = write_result("supervisor", payload, results_dir=results_dir)
    typer.echo(f"results: {path}")
    return payload


# ---------------------------------------------------------------- every benchmark


# One row of the summary table: which benchmark, what was measured, the value as printed.
SummaryRow = dict[str, Any]


def _trainer_summary(quick: bool) -> list[SummaryRow]:
    started = time.strftime("%Y%m%dT%H%M%S")
    if quick:
        trainer(models="tiny", runs="1,2", steps=1)
    else:
        trainer()
    # The trainer command prints and writes; its summary is read back from what it wrote.
    result = json.loads((RESULTS_DIR / "trainer-latest.json").read_text())
    if result.get("created", "") < started:
        raise RuntimeError("the trainer benchmark wrote no new result")
    return [
        _summary_row(
            "trainer",
            f"{m['model']} {m['mode']} x{m['runs']}",
            f"{_format(m['tokens_per_s'])} tok/s, {_format(m['peak_memory_mb'])} MB peak",
        )
        for m in result["measurements"]
    ]


def _supervisor_summary(quick: bool) -> list[SummaryRow]:
    from workbench.bench.supervisor import SupervisorBenchSettings

    settings = SupervisorBenchSettings.quick() if quick else SupervisorBenchSettings()
    return _rows_of("supervisor", _run_supervisor_benchmark(settings))


def _checked_rows(name: str, result: dict[str, Any]) -> list[SummaryRow]:
    """A benchmark's summary rows; a failure if its experiment itself failed (e2e, sweep)."""
    rows = _rows_of(name, result)
    if result.get("exit_code") not in (None, 0):
        raise BenchmarkFailed(f"exit code {result['exit_code']}", rows)
    return rows


def _inference_summary(quick: bool) -> list[SummaryRow]:
    from workbench.bench.inference import run_inference_benchmark

    return _checked_rows("inference", run_inference_benchmark(quick=quick))


def _prefill_summary(quick: bool) -> list[SummaryRow]:
    from workbench.bench.prefill import run_prefill_benchmark

    return _rows_of("prefill", run_prefill_benchmark(quick=quick))


def _e2e_summary(quick: bool) -> list[SummaryRow]:
    from workbench.bench.e2e import run_e2e_benchmark

    return _checked_rows("e2e", run_e2e_benchmark(quick=quick))


def _e2e_separate_summary(quick: bool) -> list[SummaryRow]:
    from workbench.bench.separate import run_separate_benchmark

    return _checked_rows("e2e-separate", run_separate_benchmark(quick=quick))


def _eval_summary(quick: bool) -> list[SummaryRow]:
    from workbench.bench.evaluation import run_eval_benchmark

    return _checked_rows("eval", run_eval_benchmark(quick=quick))


def _sweep_summary(quick: bool) -> list[SummaryRow]:
    from workbench.bench.sweep import run_sweep_benchmark

    return _checked_rows("sweep", run_sweep_benchmark(quick=quick))


def _load_summary(quick: bool) -> list[SummaryRow]:
    from workbench.bench.load.runner import run_load_benchmark

    return _checked_rows("load", run_load_benchmark(quick=quick))


class BenchmarkFailed(Exception):
    """A benchmark that ran but failed; `rows` are what it measured all the same."""

    def __init__(self, message: str, rows: list[SummaryRow]) -> None:
        super().__init__(message)
        self.rows = rows


def _rows_of(name: str, result: dict[str, Any]) -> list[SummaryRow]:
    """A benchmark's "summary" rows: dicts with metric, value (and unit), or sequences."""
    rows = []
    for entry in result.get("summary", []):
        if isinstance(entry, dict):
            metric = entry.get("metric", "?")
            value = _format(entry.get("value"), entry.get("unit"))
        else:
            metric, value, *unit = entry
            value = _format(value, unit[0] if unit else None)
        rows.append(_summary_row(name, str(metric), value))
    return rows or [_summary_row(name, "(no summary rows)", "")]


def _format(value: Any, unit: str | None = None) -> str:
    from workbench.bench.supervisor import format_value

    return format_value(value, unit)


def _summary_row(benchmark: str, metric: str, value: str) -> SummaryRow:
    return {"benchmark": benchmark, "metric": metric, "value": value}


# In the order `just bench` runs them; each takes `quick` and returns summary rows.
BENCHMARKS: dict[str, Callable[[bool], list[SummaryRow]]] = {
    "trainer": _trainer_summary,
    "inference": _inference_summary,
    "prefill": _prefill_summary,
    "e2e": _e2e_summary,
    "e2e-separate": _e2e_separate_summary,
    "eval": _eval_summary,
    "sweep": _sweep_summary,
    "supervisor": _supervisor_summary,
    "load": _load_summary,
}

AllQuickOption = Annotated[
    bool,
    typer.Option(
        "--quick", help="Fewer steps and sizes in every benchmark: a smoke test of them all."
    ),
]
OnlyOption = Annotated[
    str | None,
    typer.Option(help=f"Run only these, comma separated: {', '.join(BENCHMARKS)}."),
]


@bench_app.command("all")
def all_benchmarks(quick: AllQuickOption = False, only: OnlyOption = None) -> None:
    """Every benchmark of the project, then one summary table (`just bench`).

    Runs trainer, inference, prefill, e2e, e2e-separate (2 runs of 5 steps with --quick, else 4 of
    20), eval, sweep, supervisor and load in turn; each writes its
    own JSON under benchmarks/results/, and the summary goes to
    benchmarks/results/summary-latest.json.
    One that fails is reported and the others still run; the exit code is 1 if any failed.
    """
    from workbench.bench.results import write_result

    selected = _selected_benchmarks(only)
    rows, outcomes = _run_benchmarks(selected, quick)
    _print_summary(rows, quick)
    path = write_result("summary", {"quick": quick, "benchmarks": outcomes, "rows": rows})
    typer.echo(f"summary: {path.with_name('summary-latest.json')}")
    if any(outcome["status"] == "failed" for outcome in outcomes.values()):
        raise typer.Exit(1)


def _selected_benchmarks(only: str | None) -> list[str]:
    """The benchmarks --only names (all by default), or a bad-parameter exit naming the rest."""
    selected = [name.strip() for name in only.split(",")] if only else list(BENCHMARKS)
    unknown = [name for name in selected if name not in BENCHMARKS]
    if unknown:
        raise typer.BadParameter(
            f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}",
            param_hint="--only",
        )
    return selected


def _run_benchmarks(
    selected: list[str], quick: bool
) -> tuple[list[SummaryRow], dict[str, dict[str, Any]]]:
    """Each benchmark in turn: its summary rows, and per benchmark ok or failed (why) and
    its seconds. One that fails is a FAILED row; the others still run."""
    from rich.console import Console

    err_console = Console(stderr=True)
    rows: list[SummaryRow] = []
    outcomes: dict[str, dict[str, Any]] = {}
    for name in selected:
        err_console.rule(f"[bold]{name}")
        started = time.perf_counter()
        try:
            rows += BENCHMARKS[name](quick)
            outcome = {"status": "ok"}
        except BenchmarkFailed as failed:
            rows += [*failed.rows, _summary_row(name, "FAILED", str(failed))]
            outcome = {"status": "failed", "message": str(failed)}
        except Exception as err:  # one broken benchmark must not hide the others' numbers
            message = f"{type(err).__name__}: {err}"
            err_console.print_exception()
            rows.append(_summary_row(name, "FAILED", message))
            outcome = {"status": "failed", "message": message}
        outcome["seconds"] = round(time.perf_counter() - started, 1)
        outcomes[name] = outcome
    return rows, outcomes


def _print_summary(rows: list[SummaryRow], quick: bool) -> None:
    from rich.table import Table

    from workbench.system.console import output_console

    table = Table(title="workbench benchmarks" + (" (quick)" if quick else ""))
    for column in ("benchmark", "metric", "value"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["benchmark"], row["metric"], row["value"])
    output_console().print(table)  # whole when piped or logged


# `bench e2e`'s options, named once so its signature reads as a list.
RecipeArg = Annotated[Path, typer.Argument(help="Recipe TOML file.")]
E2eMaxStepsOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Override \\[defaults] max_steps for every run (shorter run); with --vs "
        "separate the default is 20.",
    ),
]
E2eKeepOption = Annotated[
    bool,
    typer.Option(help="Keep the scratch experiment directory (logs, checkpoints) after."),
]
VsOption = Annotated[
    str | None,
    typer.Option(
        "--vs",
        help="separate: the same N runs as one experiment, as N experiments one after "
        "another, and as N at once (where memory allows); RECIPE's runs are replaced.",
    ),
]
VsRunsOption = Annotated[
    int, typer.Option(min=1, help="With --vs separate: how many runs (1 to 32).")
]
AtOnceOption = Annotated[
    bool, typer.Option(help="With --vs separate: also start the N experiments together.")
]
SeparateOption = Annotated[
    bool,
    typer.Option(
        help="With --vs separate: run the separate setups too (--no-separate: the "
        "shared experiment alone, e.g. to measure a change at a size whose separate "
        "figures are known)."
    ),
]
SeedControlOption = Annotated[
    bool,
    typer.Option(
        help="With --vs separate: train a run whose curve split from its twin's alone "
        "under 4 other seeds, and pass it if it ends where it ends alone (a 95 % "
        "prediction interval)."
    ),
]


@bench_app.command("e2e")
def e2e(
    recipe: RecipeArg = Path("recipes/reverse_text.toml"),
    max_steps: E2eMaxStepsOption = None,
    keep_outputs: E2eKeepOption = False,
    vs: VsOption = None,
    runs: VsRunsOption = 4,
    at_once: AtOnceOption = True,
    separate: SeparateOption = True,
    seed_control: SeedControlOption = True,
) -> None:
    """Reward vs wall-clock for RECIPE: `workbench up RECIPE --headless`, for real.

    Runs in a scratch working directory (nothing lands in the repository), then reads
    every run's metrics.jsonl and writes the curves as JSON plus a PNG plot
    (benchmarks/results/e2e-latest.png), with each run's first-5 vs last-5 mean reward,
    steps/min and wall time.

    With --vs separate: N runs of RECIPE's task (learning rates 1e-3, 2e-3, 3e-3, 5e-3,
    4e-3, 6e-3, 7e-3, 8e-3) as one experiment, as N experiments one after another, and as
    N experiments at once when N times one experiment's peak memory fits in what is
    available (else it says so). Per setup: wall time, run-steps per hour, CPU-seconds of
    the whole process trees (and by role), peak memory, each run's time to its first and
    last step, and where the time went (trainer, orchestrators, vLLM: busy, waiting,
    starting); the speedups over the shared setup; and whether every run's curve is the
    same in every setup (exit status 1 if not; a run that split, alone under other seeds
    too). benchmarks/results/e2e-separate-latest.json and .png.
    """
    if vs is not None:
        _e2e_vs_separate(recipe, vs, runs, max_steps, at_once, keep_outputs, separate, seed_control)
        return
    from workbench.bench.e2e import run_e2e_benchmark

    report = run_e2e_benchmark(recipe, max_steps=max_steps, keep_outputs=keep_outputs)
    typer.echo(f"results: {report['path']}")
    if "scratch_dir" in report:
        typer.echo(f"experiment directory: {report['scratch_dir']}")
    if report["exit_code"] != 0:
        raise typer.Exit(1)


def _e2e_vs_separate(
    recipe: Path,
    vs: str,
    runs: int,
    max_steps: int | None,
    at_once: bool,
    keep_outputs: bool,
    separate: bool,
    seed_control: bool,
) -> None:
    from workbench.bench.separate import run_separate_benchmark
    from workbench.bench.separate_setup import SeparateBenchError

    if vs != "separate":
        raise typer.BadParameter(f"compare with: separate, not {vs!r}", param_hint="--vs")
    try:
        report = run_separate_benchmark(
            recipe,
            runs=runs,
            max_steps=max_steps,
            at_once=at_once,
            keep_outputs=keep_outputs,
            separate=separate,
            seed_control=seed_control,
        )
    except SeparateBenchError as err:
        raise typer.BadParameter(str(err)) from None
    typer.echo(f"results: {report['path']}")
    if report["exit_code"] != 0:
        raise typer.Exit(1)


@bench_app.command("faults")
def faults(
    quick: Annotated[
        bool, typer.Option("--quick", help="Five scenarios on 10-step runs (CI-sized).")
    ] = False,
    seed: Annotated[int, typer.Option(help="Draws the moment of each injection.")] = 0,
    scenario: Annotated[
        list[str] | None,
        typer.Option(help="Run only these scenarios (repeatable); see the table for names."),
    ] = None,
    keep_outputs: Annotated[
        bool, typer.Option(help="Keep each scenario's experiment directory.")
    ] = False,
) -> None:
    """Faults injected into the real system, and what it promises checked after each.

    For each scenario a fresh experiment (the built-in tiny model, vLLM's server, the
    torchrun trainer, two runs of 16 steps, a checkpoint every 4; --quick: 10 and 3) is
    started with `workbench up --headless --detach`; at a step drawn from the seed the
    fault is injected; once the runs are done, `workbench down`. Reported per scenario:
    faults injected, runs completed, steps trained twice (at most one checkpoint interval),
    incomplete checkpoints loaded, half-written files, processes left after `down`, and
    seconds until every run trained again. Exit status 1 if any scenario broke a promise.
    """
    from workbench.bench.faults.runner import format_table, run_faults_benchmark

    try:
        report = run_faults_benchmark(
            seed=seed, quick=quick, only=scenario or None, keep_outputs=keep_outputs
        )
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--scenario") from None
    typer.echo(format_table(report))
    typer.echo(f"results: {report['path']}")
    if not all(record["ok"] for record in report["scenarios"]):
        raise typer.Exit(1)


@bench_app.command("eval")
def evaluation(
    recipe: RecipeArg = Path("recipes/reverse_text.toml"),
    quick: Annotated[bool, typer.Option(help="Fewer repetitions.")] = False,
    verifiers: Annotated[
        bool,
        typer.Option(
            help="Also episodes per second of the verifiers reverse-text taskset "
            "(recipes/verifiers_tasks) beside RECIPE's environment, same batch and lengths "
            "(needs `workbench env install verifiers`)."
        ),
    ] = False,
) -> None:
    """What an eval of held-out prompts costs training, against a real vLLM server.

    With RECIPE's first run config: an eval alone, a training step's generation alone,
    and that generation with an eval beside it (as the orchestrator runs them); medians
    of alternating repetitions. With --verifiers, the same step and eval on a verifiers
    environment too, in episodes per second.
    """
    from workbench.bench.evaluation import run_eval_benchmark

    report = run_eval_benchmark(recipe, quick=quick, verifiers=verifiers)
    typer.echo(f"results: {report['path']}")


@bench_app.command("sweep")
def sweep(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file with a \\[sweep.scheduler].")] = (
        Path("recipes/reverse_text_sweep.toml")
    ),
    quick: Annotated[
        bool, typer.Option(help="Every run capped at 10 steps (one rung): a few minutes.")
    ] = False,
    max_steps: Annotated[
        int | None,
        typer.Option(min=1, help="Override \\[defaults] max_steps for every run of each."),
    ] = None,
    keep_outputs: Annotated[
        bool, typer.Option(help="Keep the scratch experiment directories after.")
    ] = False,
) -> None:
    """A sweep with its early stopping (ASHA), with PBT, and with every run to max_steps.

    Runs RECIPE headless as written (ASHA), then with population-based training as its
    \\[sweep.scheduler] (the same metric; judged every quarter of max_steps, rounded to the
    eval interval; the bottom quarter takes a checkpoint of the top quarter), then without
    a scheduler: one after the other with the same slots, each in a scratch directory.
    Reports each one's wall time (vLLM start included), CPU-seconds (user + system of its
    whole process tree), trainer steps and winner (as `sweep report` names it, with its
    lineage); for ASHA and for PBT, whether the exhaustive sweep picks the same
    configuration, how far apart the winners' final eval rewards are, and the target: within
    0.02 of the exhaustive winner in at most 0.5x the wall time. Results as JSON and a PNG
    (benchmarks/results/sweep-latest.png) of each mode's eval curves. With --quick the
    shipped sweep took 12 minutes for all three on a busy 2-core machine (2026-11-27).
    """
    from workbench.bench.sweep import SweepBenchError, run_sweep_benchmark

    try:
        report = run_sweep_benchmark(
            recipe, quick=quick, max_steps=max_steps, keep_outputs=keep_outputs
        )
    except SweepBenchError as err:
        raise typer.BadParameter(str(err), param_hint="RECIPE") from None
    typer.echo(f"results: {report['path']}")
    if report["exit_code"] != 0:
        raise typer.Exit(1)


# `bench load`'s longer options, named once so its signature reads as a list.
DurationOption = Annotated[
    float | None, typer.Option(min=1, help="Seconds of churn (default 600; --quick: 60).")
]
IntervalOption = Annotated[
    float, typer.Option(min=0.5, help="Seconds between evictions (runs are added back).")
]
LoadRecipeOption = Annotated[Path, typer.Option(help="The recipe whose model and task to run.")]
LoadRunsOption = Annotated[
    int, typer.Option(min=1, help="Unfinished runs at any time (the recipe's and added).")
]
SlotsOption = Annotated[
    int,
    typer.Option(min=1, help="Trainer slots (\\[trainer] max_concurrent_runs); at most --runs."),
]


@bench_app.command("load")
def load(
    duration: DurationOption = None,
    quick: Annotated[bool, typer.Option("--quick", help="60 s of churn: a few minutes.")] = False,
    interval: IntervalOption = 5.0,
    seed: Annotated[int, typer.Option(help="Draws which run each eviction takes.")] = 0,
    recipe: LoadRecipeOption = Path("recipes/reverse_text.toml"),
    keep_outputs: Annotated[
        bool, typer.Option(help="Keep the scratch experiment directory after.")
    ] = False,
    runs: LoadRunsOption = 16,
    slots: SlotsOption = 4,
) -> None:
    """The supervisor, trainer and TUI under runs coming and going, and the TUI's latency.

    RECIPE's model and task with RUNS (16) runs of 8 short steps on SLOTS (4) trainer slots,
    the rest waiting, started with `workbench up --headless --detach`. For the duration,
    every INTERVAL seconds one unfinished run is evicted (an active or a waiting one, by a
    seeded coin) and runs are added until RUNS are unfinished again, through the
    supervisor's control socket;
    meanwhile the TUI, attached headless in this process, gets a key every second (move the
    selection, open a run, back) and the time from each key to the first frame showing its
    effect is measured. Then: supervisor alive, no process ended unasked, no slot held by
    an ended run or free while runs wait, every run added accounted for, every finished
    run's metrics complete, listeners on 127.0.0.1 only; after `workbench down`, no process
    left and nothing half-written. Exit status 1 if a check failed.
    """
    from workbench.bench.load.runner import LoadBenchError, format_table, run_load_benchmark

    if slots > runs:
        raise typer.BadParameter(
            f"--slots {slots} is more than --runs {runs}: the load fills every slot first",
            param_hint="--slots",
        )
    try:
        report = run_load_benchmark(
            runs_at_once=runs,
            slots=slots,
            duration_s=duration,
            quick=quick,
            interval_s=interval,
            seed=seed,
            recipe=recipe,
            keep_outputs=keep_outputs,
        )
    except LoadBenchError as err:
        typer.echo(f"load benchmark: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(format_table(report))
    typer.echo(f"results: {report['path']}")
    if not report["ok"]:
        raise typer.Exit(1)


@bench_app.command("discovery")
def discovery(
    baseline: Annotated[
        Path,
        typer.Option(
            exists=True,
            file_okay=False,
            help="A checkout of the code to compare with (e.g. `git archive` of main).",
        ),
    ],
    seconds: Annotated[
        float, typer.Option(min=5, help="How long discovery's CPU is measured.")
    ] = 60.0,
    step_every: Annotated[
        float, typer.Option(min=0.5, help="Seconds between two steps of one run.")
    ] = 10.0,
    trials: Annotated[
        int, typer.Option(min=1, help="Discovery latency samples per way of making a run.")
    ] = 10,
    results_dir: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS_DIR,
) -> None:
    """Threads, watches, CPU and latency of run discovery and the TUI's change feed, for
    this tree and BASELINE side by side (`workbench/bench/discovery.py`). About 8 minutes;
    starts stand-in supervisors, never vLLM or torchrun."""
    from workbench.bench.discovery import compare
    from workbench.bench.results import write_result

    path = write_result(
        "discovery", compare(baseline, seconds, step_every, trials), results_dir=results_dir
    )
    typer.echo(f"results: {path}")


@bench_app.command("tinker")
def tinker(
    clients: Annotated[
        str, typer.Option(help="Comma-separated K: clients at once, and the same K in a row.")
    ] = "1,4,8",
    steps: Annotated[int, typer.Option(min=1, help="RL steps each client runs.")] = 4,
    quick: Annotated[bool, typer.Option(help="K = 1, 2 and 2 steps: a smoke test.")] = False,
    results_dir: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS_DIR,
) -> None:
    """K Tinker clients (the public SDK, a small RL loop: a new sampling client, a group
    sampled, importance_sampling forward_backward, optim_step) at once against one
    `workbench serve`, and the same K one after another: wall time, steps a second, their
    ratio, and a step's forward_backward + optim_step round trip beyond the trainer's
    compute (`workbench/bench/tinker.py`). Targets: 8 at once >= 3x 8 in a row; a solo
    round trip under 50 ms beyond compute."""
    from workbench.bench.results import write_result
    from workbench.bench.tinker import print_report, run_tinker_benchmark

    ks = [1, 2] if quick else _split_ints(clients)
    if not ks or min(ks) < 1:
        raise typer.BadParameter("give positive integers, e.g. 1,4,8", param_hint="--clients")
    report = run_tinker_benchmark(ks, 2 if quick else steps, warm_up=not quick)
    print_report(report)
    path = write_result("tinker-quick" if quick else "tinker", report, results_dir=results_dir)
    typer.echo(f"results: {path}")
