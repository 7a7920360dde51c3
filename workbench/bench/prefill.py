"""`workbench bench prefill`: what seeded sampling over split prefills costs on vLLM's CPU build.

Two ways keep a seeded request alive when its prompt is too long for one engine step:

- `rewind` (what workbench does): vLLM splits the prefill across steps (chunked prefill, its
  default) and workbench's plugin restores the CPU generator of each request whose sampled
  token is thrown away (`workbench.inference.seeded_sampling`);
- `no-split`: `--no-enable-chunked-prefill`, so a prefill always runs whole in one step
  (vLLM then needs `--max-num-batched-tokens` at least `max_model_len`).

The workload is one orchestrator step of long prompts: `letter_count`'s default prompts
(about 105 tokens with its system prompt) and `dataset`-like 300-letter texts, 16 prompts x
8 seeded completions each, all in flight at once, `ignore_eos` so every pass does the same
work. Servers of the two kinds start one at a time (two would not fit beside each other
on a small machine), alternating, `rounds` times each; every server gets an untimed
warm-up pass. Reported: the median wall time of a pass per way and prompt kind, the
spread, and whether both ways gave every seeded request the same tokens.
"""

from __future__ import annotations

import os
import random
import statistics
import string
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from workbench.testing.local_server import LocalServer, start_local_server, stop_local_server

BASE_MODEL = "builtin:tiny-reverse"
MAX_MODEL_LEN = 512
PROMPTS = 16
COMPLETIONS_PER_PROMPT = 8
MAX_TOKENS = 16
TEXT_LETTERS = 300
WAYS: dict[str, tuple[str, ...]] = {
    "rewind": (),
    "no-split": (
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(PROMPTS * COMPLETIONS_PER_PROMPT * MAX_MODEL_LEN),
    ),
}


def workload_chats() -> dict[str, list[list[dict[str, str]]]]:
    """The chats of each prompt kind: letter_count's first prompts, and 300-letter texts."""
    from workbench.envs import get_environment

    letters = get_environment("letter_count").sample_prompts(PROMPTS, seed=0)
    rng = random.Random(0)
    texts = [
        [{"role": "user", "content": "".join(rng.choices(string.ascii_lowercase, k=TEXT_LETTERS))}]
        for _ in range(PROMPTS)
    ]
    return {"letter_count": [p.messages for p in letters], "300-letter texts": texts}


def run_pass(
    http: httpx.Client, server: LocalServer, chats: list[list[dict[str, str]]]
) -> tuple[float, list[list[list[int]]]]:
    """Every chat's seeded completions at once: (wall seconds, token ids by chat)."""
    url = f"{server.endpoint.server_url}/v1/chat/completions"

    def one(index: int) -> list[list[int]]:
        body = {
            "model": BASE_MODEL,
            "messages": chats[index],
            "n": COMPLETIONS_PER_PROMPT,
            "max_tokens": MAX_TOKENS,
            "temperature": 1.0,
            "seed": index,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        response = http.post(url, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"the server answered {response.status_code}: {response.text[:300]}")
        choices = sorted(response.json()["choices"], key=lambda choice: choice["index"])
        return [choice["token_ids"] for choice in choices]

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(chats)) as pool:
        tokens = list(pool.map(one, range(len(chats))))
    return time.monotonic() - started, tokens


def measure_server(
    way: str, scratch: Path, chats: dict[str, list[list[dict[str, str]]]], passes: int
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Start one server of `way`, warm it up, time `passes` passes of each prompt kind."""
    server = start_local_server(
        scratch,
        BASE_MODEL,
        max_loras=1,
        max_lora_rank=8,
        max_model_len=MAX_MODEL_LEN,
        extra_args=WAYS[way],
    )
    walls: dict[str, list[float]] = {kind: [] for kind in chats}
    tokens: dict[str, Any] = {}
    try:
        with httpx.Client(
            headers={"Authorization": f"Bearer {server.endpoint.api_key}"},
            timeout=httpx.Timeout(600.0, connect=10.0),
            limits=httpx.Limits(max_connections=PROMPTS + 4),
        ) as http:
            for kind, kind_chats in chats.items():
                _, tokens[kind] = run_pass(http, server, kind_chats)  # warm-up
            for _ in range(passes):
                for kind, kind_chats in chats.items():
                    wall, _ = run_pass(http, server, kind_chats)
                    walls[kind].append(wall)
    finally:
        stop_local_server(server.process)
    return walls, tokens


def run_prefill_benchmark(quick: bool = False) -> dict[str, Any]:
    """Measure, write `benchmarks/results/prefill-*.json`, print a table; return the report."""
    from workbench.bench.results import write_result
    from workbench.models.resolve import resolve_model

    rounds, passes = (1, 2) if quick else (2, 3)
    resolve_model(BASE_MODEL)  # builds the model on first use: not timed
    chats = workload_chats()
    load_before = os.getloadavg()
    walls: dict[str, dict[str, list[float]]] = {way: {k: [] for k in chats} for way in WAYS}
    tokens: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="workbench-bench-prefill-") as scratch_name:
        for round_index in range(rounds):
            for way in WAYS:
                scratch = Path(scratch_name) / f"{way}-{round_index}"
                scratch.mkdir()
                server_walls, tokens[way] = measure_server(way, scratch, chats, passes)
                for kind, values in server_walls.items():
                    walls[way][kind] += values
    report: dict[str, Any] = {
        "model": BASE_MODEL,
        "workload": {
            "prompts": PROMPTS,
            "completions_per_prompt": COMPLETIONS_PER_PROMPT,
            "max_tokens": MAX_TOKENS,
            "max_model_len": MAX_MODEL_LEN,
            "rounds": rounds,
            "passes_per_server": passes,
        },
        "ways": {way: " ".join(args) or "(vLLM's defaults)" for way, args in WAYS.items()},
        "same_tokens": tokens["rewind"] == tokens["no-split"],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "results": [
            {
                "way": way,
                "prompts": kind,
                "median_wall_s": round(statistics.median(values), 3),
                "min_wall_s": round(min(values), 3),
                "max_wall_s": round(max(values), 3),
                "passes": [round(v, 3) for v in values],
            }
            for way, by_kind in walls.items()
            for kind, values in by_kind.items()
        ],
    }
    report["summary"] = [
        {
            "metric": f"{row['way']}, {row['prompts']}",
            "value": f"{row['median_wall_s']:.2f} s a step ({row['min_wall_s']:.2f}-"
            f"{row['max_wall_s']:.2f})",
        }
        for row in report["results"]
    ] + [{"metric": "same tokens both ways", "value": str(report["same_tokens"])}]
    report["path"] = str(write_result("prefill", report))
    print_table(report)
    return report


def print_table(report: dict[str, Any]) -> None:
    print(f"{'way':<10} {'prompts':<18} {'median s':>9} {'min-max s':>14}")
    for row in report["results"]:
        spread = f"{row['min_wall_s']:.2f}-{row['max_wall_s']:.2f}"
        print(f"{row['way']:<10} {row['prompts']:<18} {row['median_wall_s']:>9.2f} {spread:>14}")
    print(f"same tokens for every seeded request both ways: {report['same_tokens']}")
