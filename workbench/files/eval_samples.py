"""What a run's policy wrote on its held-out eval prompts: what runs are compared by.

metrics.jsonl keeps each eval's scores; this file keeps, for each recent eval, every prompt
with its completions and their rewards, so runs can be read side by side on the same
prompts (`workbench samples --compare`, the TUI's side-by-side screen). The orchestrator's
evaluator writes `run_<id>/eval_samples.jsonl`: one JSON line per eval, keyed by its
policy version, the last `KEEP_EVALS` evals only, rewritten atomically at each eval (a
reader never sees half an eval).

Small and bounded: at most `MAX_PROMPTS` prompts of an eval are kept (the first ones, the
same every eval) and each completion is cut at `MAX_TEXT_CHARS` characters, so the file
stays under about 16 x 64 x 2 KB = 2 MB even for long completions; the shipped recipes'
32 short prompts take about 4 KB an eval.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.files import layout

KEEP_EVALS = 16
MAX_PROMPTS = 64
MAX_TEXT_CHARS = 2000
CUT_MARK = "…"


@dataclass(frozen=True)
class EvalCompletion:
    text: str
    reward: float
    truncated: bool  # generation stopped at max_tokens


@dataclass(frozen=True)
class EvalPrompt:
    """One held-out prompt and the policy's completions of it (`eval.rollouts_per_prompt`)."""

    prompt: str
    answer: str
    completions: list[EvalCompletion]

    @property
    def reward(self) -> float:
        """The mean reward of its completions (the only one's with greedy evals)."""
        rewards = [c.reward for c in self.completions]
        return sum(rewards) / len(rewards) if rewards else 0.0


@dataclass(frozen=True)
class EvalSamples:
    """One eval: the policy version scored, its adapter, and every prompt kept."""

    policy_version: int
    adapter: str
    prompts: list[EvalPrompt]
    time: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> EvalSamples:
        prompts = [
            EvalPrompt(
                prompt=p["prompt"],
                answer=p["answer"],
                completions=[EvalCompletion(**c) for c in p["completions"]],
            )
            for p in record["prompts"]
        ]
        return cls(
            policy_version=record["policy_version"],
            adapter=record["adapter"],
            prompts=prompts,
            time=record["time"],
        )


def bounded(samples: EvalSamples) -> EvalSamples:
    """`samples` with at most MAX_PROMPTS prompts and every text cut at MAX_TEXT_CHARS."""
    prompts = [
        EvalPrompt(
            _cut(p.prompt),
            _cut(p.answer),
            [EvalCompletion(_cut(c.text), c.reward, c.truncated) for c in p.completions],
        )
        for p in samples.prompts[:MAX_PROMPTS]
    ]
    return EvalSamples(samples.policy_version, samples.adapter, prompts, samples.time)


def record_eval(run: Path, samples: EvalSamples, keep: int = KEEP_EVALS) -> None:
    """Add one eval to the run's file (replacing an earlier record of its policy version,
    as a restarted orchestrator's repeat of an eval cut short), keeping the newest `keep`."""
    kept = [e for e in read_evals(run) if e.policy_version != samples.policy_version]
    kept = [*kept, bounded(samples)][-keep:]
    lines = [json.dumps(e.to_json(), separators=(",", ":")) for e in kept]
    layout.atomic_write_text(layout.eval_samples_path(run), "\n".join(lines) + "\n")


def read_evals(run: Path) -> list[EvalSamples]:
    """The recorded evals, oldest first; an unreadable line is skipped."""
    try:
        text = layout.eval_samples_path(run).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    evals = []
    for line in text.splitlines():
        try:
            evals.append(EvalSamples.from_json(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return evals


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + CUT_MARK
