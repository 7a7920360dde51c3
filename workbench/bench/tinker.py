"""`workbench bench tinker`: K Tinker clients running the same small RL loop against one
service, all at once against one after another, and what a round trip costs beyond compute.

One experiment (the built-in model, `workbench serve`, one trainer slot per client of the
whole benchmark, so no client waits for a slot another has finished with) serves every
client. A client is a process of its own using only the public `tinker` SDK, the shape of
the cookbook's `rl_loop`: each step a new sampling client (`save_weights_and_get_sampling_
client`), a group of samples of one prompt, rewards centred into advantages, an
`importance_sampling` `forward_backward` and an `optim_step`. Its setup (importing the SDK,
creating its model) is not timed: the K clients start their steps together.

For K = 1, 4, 8 (by default): the K clients at once (wall from their common start to the
last one's end) and the same K one after another (the sum of their loops); throughput is
steps a second, and the ratio at once / in a row. The round trip of a step's
`forward_backward` + `optim_step` (from the first submit to the second result, as the
client sees it) less the trainer's compute in that window (its busy spans, `spans/trainer`:
the pass that computed the items, its publishing) is what the service, the work-item files
and the polls cost: its median at K = 1 is the solo overhead.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.files import layout
from workbench.files import spans as span_files
from workbench.files.layout import spans_dir
from workbench.system.ports import free_port
from workbench.system.signals import sigterm_as_interrupt

BASE = "builtin:tiny-reverse"
PROMPT = [5, 6, 7, 8, 9, 10]
GROUP = 4  # samples of the prompt a step
MAX_TOKENS = 8
LORA_RANK = 8
WARMUP_RUN = "warmup"
TARGET_RATIO = 3.0  # 8 at once >= 3x the throughput of 8 in a row (issue 59)
TARGET_OVERHEAD_MS = 50.0  # a solo round trip's overhead


@dataclass
class StepTimes:
    """One step of one client, unix seconds."""

    start: float
    sampler_ready: float  # the new sampling client made (its weights saved and in vLLM)
    sampled: float  # the group sampled
    submitted: float  # forward_backward submitted (optim_step right after)
    done: float  # optim_step's result in hand

    @property
    def round_trip_s(self) -> float:
        return self.done - self.submitted


@dataclass
class ClientTimes:
    client: int
    steps: list[StepTimes]

    @property
    def start(self) -> float:
        return self.steps[0].start

    @property
    def end(self) -> float:
        return self.steps[-1].done


@dataclass
class Setting:
    """K clients, at once or in a row."""

    clients: int
    mode: str  # "at_once" or "in_a_row"
    wall_s: float
    steps: int
    steps_per_s: float
    round_trip_ms: float  # median over every step
    compute_ms: float  # median trainer compute in a step's round trip
    overhead_ms: float  # median round trip less its compute
    sample_ms: float  # median: new sampling client and the group sampled
    sampler_ms: float  # median: the new sampling client alone (its part of sample_ms)
    per_client: list[dict[str, Any]] = field(default_factory=list)


# ---------------------------------------------------------------- pure parts


def recipe_text(output_dir: Path, slots: int) -> str:
    """The benchmark's experiment: a trainer slot per client (and the warm-up client's),
    and the one native run a recipe needs, a step long (it warms vLLM and the trainer; the
    clients start once it has finished)."""
    return (
        "[experiment]\n"
        'name = "bench-tinker"\n'
        f'output_dir = "{output_dir}"\n'
        "[model]\n"
        f'base = "{BASE}"\n'
        "[inference]\n"
        "max_loras = 8\n"  # a sampler adapter per client at once, not one per slot
        "[trainer]\n"
        f"max_concurrent_runs = {slots}\n"
        f"lora = {{ rank = {LORA_RANK}, alpha = 16 }}\n"
        "[defaults]\n"
        "env_args = { min_length = 3, max_length = 3 }\n"
        "max_steps = 1\n"
        "batch_size = 8\n"
        "rollouts_per_prompt = 4\n"
        "eval = { interval = 0 }\n"
        "[[runs]]\n"
        f'id = "{WARMUP_RUN}"\n'
    )


def wait_for_warmup(experiment: Path, timeout_s: float = 600) -> None:
    """Until the native warm-up run has finished (its slot and CPU free for the clients)."""
    finished = layout.finished_path(layout.run_dir(experiment, layout.RUN_PREFIX + WARMUP_RUN))
    deadline = time.monotonic() + timeout_s
    while not finished.is_file():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{finished} not written in {timeout_s:.0f} s")
        time.sleep(0.5)


def overlap_s(spans: list[span_files.Span], start: float, end: float) -> float:
    """Seconds of `spans` inside [start, end] (spans of one line do not overlap)."""
    return sum(max(0.0, min(s.end, end) - max(s.start, start)) for s in spans)


def centred(rewards: list[float]) -> list[float]:
    mean = sum(rewards) / len(rewards)
    return [reward - mean for reward in rewards]


def reward(completion: list[int]) -> float:
    """The share of the completion that reverses the prompt (the task of the built-in model)."""
    wanted = PROMPT[::-1]
    hits = sum(a == b for a, b in zip(completion, wanted, strict=False))
    return hits / len(wanted)


def setting_of(clients: list[ClientTimes], mode: str, compute: list[span_files.Span]) -> Setting:
    """A setting's figures from its clients' step times and the trainer's busy spans."""
    if mode == "at_once":
        wall = max(c.end for c in clients) - min(c.start for c in clients)
    else:
        wall = sum(c.end - c.start for c in clients)
    steps = [step for c in clients for step in c.steps]
    trips = [step.round_trip_s for step in steps]
    computed = [overlap_s(compute, step.submitted, step.done) for step in steps]
    return Setting(
        clients=len(clients),
        mode=mode,
        wall_s=round(wall, 3),
        steps=len(steps),
        steps_per_s=round(len(steps) / wall, 4),
        round_trip_ms=_ms(statistics.median(trips)),
        compute_ms=_ms(statistics.median(computed)),
        overhead_ms=_ms(statistics.median(t - c for t, c in zip(trips, computed, strict=True))),
        sample_ms=_ms(statistics.median(step.sampled - step.start for step in steps)),
        sampler_ms=_ms(statistics.median(step.sampler_ready - step.start for step in steps)),
        per_client=[
            {"client": c.client, "loop_s": round(c.end - c.start, 3), "steps": c.steps}
            for c in clients
        ],
    )


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def summary(settings: list[Setting]) -> list[dict[str, Any]]:
    """The headline figures: the throughput ratio per K and the solo overhead."""
    by = {(s.clients, s.mode): s for s in settings}
    rows = []
    for k in sorted({s.clients for s in settings}):
        together, apart = by.get((k, "at_once")), by.get((k, "in_a_row"))
        if together and apart:
            ratio = round(together.steps_per_s / apart.steps_per_s, 2)
            rows.append({"metric": f"{k} clients at once / in a row", "value": ratio, "unit": "x"})
    if (solo := by.get((1, "in_a_row")) or by.get((1, "at_once"))) is not None:
        rows.append({"metric": "solo round trip beyond compute", "value": solo.overhead_ms,
                     "unit": "ms"})  # fmt: skip
    return rows


# ---------------------------------------------------------------- a client (its own process)


def client_loop(url: str, key: str, steps: int, client: int, together, results) -> None:
    """One client: set up, wait for the others (`together`, a barrier or None), then `steps`
    steps of the RL loop; its times go into `results`. With others it waits for them again
    before it ends: a process's end (the SDK's closing flush and session, the interpreter's
    teardown) costs up to about a CPU-second here and, landing in the others' steps, would be
    timed at once while one after another it falls between the loops."""
    import numpy as np
    import tinker

    service = tinker.ServiceClient(base_url=url, api_key=key)
    training = service.create_lora_training_client(
        base_model=BASE, rank=LORA_RANK, seed=client
    ).result()
    params = tinker.types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=client)
    adam = tinker.types.AdamParams(learning_rate=1e-3)
    prompt = tinker.types.ModelInput.from_ints(PROMPT)
    if together is not None:
        together.wait()
    times = []
    for _ in range(steps):
        start = time.time()
        sampler = training.save_weights_and_get_sampling_client().result()
        sampler_ready = time.time()
        group = sampler.sample(prompt, GROUP, params).result().sequences
        sampled = time.time()
        advantages = centred([reward(list(seq.tokens)) for seq in group])
        datums = [_datum(tinker, np, seq, adv) for seq, adv in zip(group, advantages, strict=True)]
        submitted = time.time()
        backward = training.forward_backward(datums, "importance_sampling")
        step = training.optim_step(adam)
        backward.result()
        step.result()
        times.append(StepTimes(start, sampler_ready, sampled, submitted, time.time()))
    results.put(ClientTimes(client, times))
    if together is not None:
        together.wait()


def _datum(tinker, np, sequence, advantage: float):
    """A sampled sequence as an importance_sampling datum: the completion's tokens weighted
    by the group-centred reward, the prompt's by nothing."""
    tokens = PROMPT + list(sequence.tokens)
    prompt_part = len(PROMPT) - 1
    logprobs = [0.0] * prompt_part + list(sequence.logprobs)
    advantages = [0.0] * prompt_part + [advantage] * len(sequence.tokens)
    return tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(tokens[1:], dtype=np.int64),
            "logprobs": np.array(logprobs, dtype=np.float32),
            "advantages": np.array(advantages, dtype=np.float32),
        },
    )


# ---------------------------------------------------------------- the benchmark


def run_clients(url: str, key: str, k: int, steps: int, first: int, at_once: bool):
    """K clients at once, or one after another; their times, in client order."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    barrier = context.Barrier(k) if at_once else None
    procs: list = []
    try:
        if at_once:
            procs = [
                context.Process(
                    target=client_loop, args=(url, key, steps, first + i, barrier, results)
                )
                for i in range(k)
            ]
            for proc in procs:
                proc.start()
            times = [results.get(timeout=1800) for _ in procs]
        else:
            times = []
            for i in range(k):
                procs.append(
                    context.Process(
                        target=client_loop, args=(url, key, steps, first + i, None, results)
                    )
                )
                procs[-1].start()
                times.append(results.get(timeout=1800))
                procs[-1].join()
        for proc in procs:
            proc.join()
    finally:
        for proc in procs:
            if proc.is_alive():  # interrupted: no client goes on without the benchmark
                proc.terminate()
    for proc in procs:
        if proc.exitcode:
            raise RuntimeError(f"a client exited with status {proc.exitcode}")
    return sorted(times, key=lambda c: c.client)


def trainer_compute(experiment: Path) -> list[span_files.Span]:
    """The trainer master's busy spans of its main line (its passes and their publishing)."""
    time.sleep(2.5)  # spans are appended at most once a second
    found = []
    for path in sorted(spans_dir(experiment).glob("trainer*.jsonl")):
        if ".1." in path.name:
            continue  # read_spans reads the rotated file with its newer one
        found += [
            s
            for s in span_files.read_spans(path)
            if s.thread == span_files.MAIN and s.kind == "busy"
        ]
    return found


def run_tinker_benchmark(
    ks: list[int], steps: int, scratch: Path | None = None, *, warm_up: bool = True
) -> dict:
    """Serve one experiment, run every setting, stop it; the report (not yet written).
    `warm_up`: one untimed client step first (see below; a smoke test goes without)."""
    scratch = scratch or Path(tempfile.mkdtemp(prefix="bench-tinker-"))
    experiment = scratch / "experiment"
    recipe = scratch / "recipe.toml"
    recipe.write_text(recipe_text(experiment, 2 * sum(ks) + 2))
    key = "tml-bench-" + os.urandom(12).hex()
    port = free_port()
    env = {**os.environ, "WORKBENCH_TINKER_API_KEY": key}
    cli = [sys.executable, "-m", "workbench.cli"]
    timed: list[tuple[list[ClientTimes], str]] = []
    # Killed (SIGTERM) as when interrupted: the experiment it started is stopped either way.
    with sigterm_as_interrupt(), _down_after(cli, experiment, env):
        started = subprocess.run(
            [*cli, "serve", str(recipe), "--port", str(port)],
            env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if started.returncode != 0:
            raise RuntimeError(f"workbench serve failed:\n{started.stdout}{started.stderr}")
        url = f"http://127.0.0.1:{port}"
        wait_for_warmup(experiment)
        # One untimed client step first: the trainer's first Tinker pass decides how it
        # computes Tinker datums (a check of about a second here, tinker_packing.py), and
        # would otherwise land in the first setting's figures.
        if warm_up:
            run_clients(url, key, 1, 1, 0, at_once=False)
        first = 1
        for k in ks:
            for at_once in (True, False):
                clients = run_clients(url, key, k, steps, first, at_once)
                timed.append((clients, "at_once" if at_once else "in_a_row"))
                first += k
        compute = trainer_compute(experiment)
    settings = [setting_of(clients, mode, compute) for clients, mode in timed]
    return {
        "model": BASE,
        "steps_per_client": steps,
        "group": GROUP,
        "max_tokens": MAX_TOKENS,
        "clients": ks,
        "settings": [asdict(s) for s in settings],
        "summary": summary(settings),
        "targets": {"ratio_8": TARGET_RATIO, "solo_overhead_ms": TARGET_OVERHEAD_MS},
        "experiment": str(experiment),
    }


@contextlib.contextmanager
def _down_after(cli: list[str], experiment: Path, env: dict) -> Iterator[None]:
    try:
        yield
    finally:
        subprocess.run([*cli, "down", str(experiment)], env=env, capture_output=True,
                       timeout=300, check=False)  # fmt: skip


def print_report(report: dict) -> None:
    from rich.table import Table

    from workbench.system.console import output_console

    table = Table(title=f"tinker: {report['steps_per_client']} RL steps a client ({BASE})")
    for column in ("K", "mode", "wall s", "steps/s", "round trip ms", "compute ms",
                   "beyond compute ms", "sample ms", "of it new sampler ms"):  # fmt: skip
        table.add_column(column)
    for s in report["settings"]:
        table.add_row(
            str(s["clients"]), s["mode"].replace("_", " "), f"{s['wall_s']:.1f}",
            f"{s['steps_per_s']:.2f}", f"{s['round_trip_ms']:.0f}", f"{s['compute_ms']:.0f}",
            f"{s['overhead_ms']:.0f}", f"{s['sample_ms']:.0f}", f"{s.get('sampler_ms', 0):.0f}",
        )  # fmt: skip
    console = output_console()
    console.print(table)
    for row in report["summary"]:
        console.print(f"{row['metric']}: {row['value']} {row['unit']}", highlight=False)
