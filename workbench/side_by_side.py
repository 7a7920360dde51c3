"""Runs side by side on the same held-out prompts: what `workbench samples --compare` and
the TUI's side-by-side screen show.

Each run's evaluator keeps its recent evals' prompts, completions and rewards
(`workbench.files.eval_samples`). For one eval step (a policy version; by default the newest
that every selected run has evaluated) this lines the runs up: a row per prompt, a cell per
run with its completion and reward.

Runs of different experiments compare when they train on the same environment (the same
`env` and `env_args`), as `workbench compare` groups runs; otherwise the comparison is
refused, naming what differs. Eval prompts are drawn by each run's `seed`: runs of
different seeds were asked different prompts, so the rows are every prompt any run was
asked, a run's cell empty where it was not, and a note says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, OrchestratorConfig, load_orchestrator_config
from workbench.experiment import RunLookupError, RunRef, resolve_run
from workbench.files import layout
from workbench.files.eval_samples import EvalPrompt, EvalSamples, read_evals
from workbench.sweep.compare import experiment_labels


class SideBySideError(ValueError):
    """The runs cannot be compared as asked; the message says why and what to do."""


@dataclass(frozen=True)
class ComparedRun:
    ref: RunRef
    label: str  # the run id, or EXPERIMENT/RUN when the runs come from several experiments
    config: OrchestratorConfig
    evals: list[EvalSamples]

    @property
    def versions(self) -> list[int]:
        return [e.policy_version for e in self.evals]

    def eval_of(self, version: int) -> EvalSamples | None:
        return next((e for e in self.evals if e.policy_version == version), None)


@dataclass(frozen=True)
class PromptRow:
    prompt: str
    answer: str
    cells: list[EvalPrompt | None]  # one per run, in the runs' order; None: not asked


@dataclass
class SideBySide:
    step: int
    runs: list[ComparedRun]
    rows: list[PromptRow]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "runs": [
                {
                    "label": run.label,
                    "experiment": str(run.ref.experiment),
                    "run_id": run.ref.run_id,
                    "adapter": run.eval_of(self.step).adapter,  # type: ignore[union-attr]
                }
                for run in self.runs
            ],
            "prompts": [
                {
                    "prompt": row.prompt,
                    "answer": row.answer,
                    "runs": {
                        run.label: None if cell is None else _cell_json(cell)
                        for run, cell in zip(self.runs, row.cells, strict=True)
                    },
                }
                for row in self.rows
            ],
            "notes": self.notes,
        }


def resolve_run_names(names: list[str], experiment: Path | None = None) -> list[RunRef]:
    """Each name as a run: `EXPERIMENT/RUN` (a run directory's path), or a run id found in
    `experiment` or the experiments under ./outputs. Raises SideBySideError naming every
    name that is not a run."""
    refs, problems = [], []
    for name in names:
        head, _, tail = name.rstrip("/").rpartition("/")
        try:
            refs.append(resolve_run(tail, Path(head)) if head else resolve_run(name, experiment))
        except RunLookupError as err:
            problems.append(str(err))
    if problems:
        raise SideBySideError("\n".join(problems))
    unique = {(ref.experiment.resolve(), ref.run_id): ref for ref in refs}
    return list(unique.values())


def load_runs(refs: list[RunRef]) -> list[ComparedRun]:
    """The runs with their configs and recorded evals, labelled; refused when their
    environments differ."""
    labels = experiment_labels(list(dict.fromkeys(ref.experiment for ref in refs)))
    several = len(labels) > 1
    runs = []
    for ref in refs:
        try:
            config = load_orchestrator_config(layout.orch_config_path(ref.path))
        except ConfigError as err:
            raise SideBySideError(f"{ref.path}: its orch.toml cannot be read: {err}") from None
        label = f"{labels[ref.experiment]}/{ref.run_id}" if several else ref.run_id
        runs.append(ComparedRun(ref, label, config, read_evals(ref.path)))
    check_same_environment(runs)
    return runs


def check_same_environment(runs: list[ComparedRun]) -> None:
    """Refuse runs whose eval rewards mean different things: another env or env_args."""
    first = runs[0]
    for run in runs[1:]:
        if run.config.env != first.config.env:
            what = f"env {first.config.env!r} and {run.config.env!r}"
        elif run.config.env_args != first.config.env_args:
            what = f"env_args {first.config.env_args} and {run.config.env_args}"
        else:
            continue
        raise SideBySideError(
            f"{first.label} and {run.label} train on different environments ({what}): their "
            "held-out prompts and rewards are not the same task. Compare runs of one "
            "environment (`workbench compare` groups them)"
        )


def choose_step(runs: list[ComparedRun], step: int | None) -> int:
    """`step` if every run evaluated it, else (None) the newest step they all evaluated."""
    common = set(runs[0].versions).intersection(*(run.versions for run in runs[1:]))
    if step is not None and step in common:
        return step
    if step is None and common:
        return max(common)
    listing = "; ".join(
        f"{run.label}: {', '.join(map(str, run.versions)) or 'none yet'}" for run in runs
    )
    wanted = f"step {step}" if step is not None else "a step"
    raise SideBySideError(
        f"not every run has a held-out eval of {wanted} (evals kept: {listing}); pass "
        "--step with one they share, or wait for their next eval (`eval.interval`)"
    )


def side_by_side(refs: list[RunRef], step: int | None = None) -> SideBySide:
    """The runs' completions of one eval step's prompts, a row per prompt."""
    if not refs:
        raise SideBySideError("no run to compare: name at least one")
    runs = load_runs(refs)
    chosen = choose_step(runs, step)
    evals = [run.eval_of(chosen) for run in runs]
    by_prompt: dict[str, list[EvalPrompt | None]] = {}
    answers: dict[str, str] = {}
    for column, evaluated in enumerate(evals):
        for prompt in evaluated.prompts:  # type: ignore[union-attr]
            cells = by_prompt.setdefault(prompt.prompt, [None] * len(runs))
            cells[column] = prompt
            answers.setdefault(prompt.prompt, prompt.answer)
    rows = [PromptRow(text, answers[text], cells) for text, cells in by_prompt.items()]
    return SideBySide(chosen, runs, rows, _notes(runs, rows))


def _notes(runs: list[ComparedRun], rows: list[PromptRow]) -> list[str]:
    notes = []
    for column, run in enumerate(runs):
        missing = sum(row.cells[column] is None for row in rows)
        if missing:
            notes.append(
                f"{run.label} was not asked {missing} of the {len(rows)} prompts: eval prompts "
                f"are drawn by a run's seed (its seed is {run.config.seed})"
            )
    return notes


def _cell_json(cell: EvalPrompt) -> dict[str, Any]:
    return {
        "reward": cell.reward,
        "completions": [
            {"text": c.text, "reward": c.reward, "truncated": c.truncated} for c in cell.completions
        ],
    }
