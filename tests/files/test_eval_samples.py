"""run_<id>/eval_samples.jsonl: each recent eval's prompts, completions and rewards, bounded."""

from __future__ import annotations

from pathlib import Path

from workbench.files import layout
from workbench.files.eval_samples import (
    KEEP_EVALS,
    MAX_PROMPTS,
    MAX_TEXT_CHARS,
    EvalCompletion,
    EvalPrompt,
    EvalSamples,
    read_evals,
    record_eval,
)


def one_eval(version: int, prompts: int = 2, text: str = "ok") -> EvalSamples:
    return EvalSamples(
        version,
        f"run_a@step{version}",
        [EvalPrompt(f"p{i}", "a", [EvalCompletion(text, 0.5, False)]) for i in range(prompts)],
    )


def test_the_file_keeps_the_newest_evals_only_and_a_repeated_version_once(tmp_path: Path):
    for version in range(KEEP_EVALS + 3):
        record_eval(tmp_path, one_eval(version))
    record_eval(tmp_path, one_eval(KEEP_EVALS + 2, text="again"))  # a restart's repeat
    evals = read_evals(tmp_path)
    assert [e.policy_version for e in evals] == list(range(3, KEEP_EVALS + 3))
    assert evals[-1].prompts[0].completions[0].text == "again"


def test_prompts_and_texts_past_the_bounds_are_cut(tmp_path: Path):
    record_eval(tmp_path, one_eval(0, prompts=MAX_PROMPTS + 5, text="x" * (3 * MAX_TEXT_CHARS)))
    (kept,) = read_evals(tmp_path)
    assert len(kept.prompts) == MAX_PROMPTS
    assert len(kept.prompts[0].completions[0].text) == MAX_TEXT_CHARS
    assert layout.eval_samples_path(tmp_path).stat().st_size < MAX_PROMPTS * MAX_TEXT_CHARS * 1.1


def test_an_unreadable_line_is_skipped_and_no_file_is_no_evals(tmp_path: Path):
    assert read_evals(tmp_path) == []
    record_eval(tmp_path, one_eval(0))
    with layout.eval_samples_path(tmp_path).open("a") as f:
        f.write("{not json\n")
    assert [e.policy_version for e in read_evals(tmp_path)] == [0]
