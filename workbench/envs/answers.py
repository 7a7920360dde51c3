"""Answers in completions: pulling the answer out of a completion, and comparing it with a
reference. The dataset environment combines one extraction with one comparison; each is a
pure function, so rewards need no model and no process.

Extractions (`Extraction`): the whole completion, the last `\\boxed{...}`, the last
`<tag>...</tag>`, the last number, or the first group of a regular expression's last match.
`<think>` blocks are dropped first in every case.

Comparisons (`Comparison`), each a reward in [0, 1]: exact match, containment, a regular
expression (the reference is the pattern), numeric equality within a tolerance, mathematical
equivalence (math-verify, the `data` extra), or graded similarity (difflib's ratio).
"""

from __future__ import annotations

import math
import re
import threading
from enum import StrEnum

from workbench.envs.base import extract_tagged, similarity, strip_reasoning

_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class Extraction(StrEnum):
    NONE = "none"
    BOXED = "boxed"
    TAG = "tag"
    LAST_NUMBER = "last_number"
    REGEX = "regex"


class Comparison(StrEnum):
    EXACT = "exact"
    CONTAINS = "contains"
    REGEX = "regex"
    NUMERIC = "numeric"
    MATH = "math"
    SIMILARITY = "similarity"


# ---------------------------------------------------------------- extraction


def extract_answer(
    completion: str, how: Extraction, *, tag: str = "answer", pattern: re.Pattern[str] | None = None
) -> str | None:
    """The answer in `completion` by `how`, stripped; None when there is none."""
    text = strip_reasoning(completion)
    if how is Extraction.NONE:
        answer = text
    elif how is Extraction.BOXED:
        answer = last_boxed(text)
    elif how is Extraction.TAG:
        answer = extract_tagged(text, tag)
    elif how is Extraction.LAST_NUMBER:
        numbers = _NUMBER.findall(text)
        answer = numbers[-1] if numbers else None
    else:
        assert pattern is not None, "a regex extraction needs its pattern"
        matches = list(pattern.finditer(text))
        answer = None if not matches else matches[-1].group(1 if pattern.groups else 0)
    if answer is None:
        return None
    return answer.strip() or None


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    opening = text.index("{", start)
    depth = 0
    for position in range(opening, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[opening + 1 : position]
    return None  # unclosed: the completion was cut off inside the box


# ---------------------------------------------------------------- comparison


def parse_number(text: str) -> float | None:
    """`text` as a number (thousands separators and a trailing period allowed), else None."""
    cleaned = text.strip().replace(",", "").rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def compare(
    answer: str | None,
    reference: str,
    how: Comparison,
    *,
    ignore_case: bool = False,
    tolerance: float = 1e-6,
) -> float:
    """The reward of `answer` against `reference` by `how`, in [0, 1]; no answer scores 0."""
    if answer is None:
        return 0.0
    if ignore_case and how is not Comparison.MATH:
        answer, reference = answer.casefold(), reference.casefold()
    if how is Comparison.EXACT:
        return float(answer == reference.strip())
    if how is Comparison.CONTAINS:
        return float(reference.strip() in answer)
    if how is Comparison.REGEX:
        flags = re.IGNORECASE if ignore_case else 0
        return float(re.fullmatch(reference, answer, flags) is not None)
    if how is Comparison.NUMERIC:
        value, expected = parse_number(answer), parse_number(reference)
        if value is None or expected is None:
            return 0.0
        return float(math.isclose(value, expected, rel_tol=tolerance, abs_tol=tolerance))
    if how is Comparison.MATH:
        return float(math_equivalent(answer, reference))
    return similarity(answer, reference.strip())


def math_equivalent(answer: str, reference: str) -> bool:
    """Whether `answer` and `reference` are the same mathematical object (math-verify)."""
    from math_verify import parse, verify  # the `data` extra; checked before launch

    # math-verify bounds its work with SIGALRM, which only the main thread may set; an
    # evaluation scores on a background thread, and there it runs without that bound.
    bounded = threading.current_thread() is threading.main_thread()
    timeout = 5 if bounded else None
    gold = parse(reference, parsing_timeout=timeout)
    target = parse(answer, parsing_timeout=timeout)
    return bool(verify(gold, target, timeout_seconds=timeout))


def math_verify_missing() -> str | None:
    """What to install when math comparison is asked for without math-verify, else None."""
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return "reward = 'math' needs math-verify: pip install 'workbench[data]'"
    return None
