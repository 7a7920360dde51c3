"""Which runs the user picked: selected, pinned, filtered, and each run's colour.

One `RunSelection` lives in the app (`WorkbenchApp.run_selection`); every screen reads it
there, so a run selected in the runs table is the one the curves view overlays, and a
run's colour is the same in every view. Nothing here reads the snapshot's files besides
a run's `control/orch.toml`, and only while a filter names a config key.

Filter syntax (`/` on the runs table): terms separated by spaces, all of which must hold.
A term without an operator is a substring of the run id (case-insensitive); `key=value`,
`key!=value`, `key>value`, `key>=value`, `key<value`, `key<=value` compare a value of the
run's orch.toml, nested tables joined by dots (`loss.kind=grpo`, `lora.rank>=8`); a key
matches a dotted key it ends (`lr` matches `lr` and `optim.lr`, `kind` matches
`loss.kind`). Values compare as numbers when both are (`lr>1e-3`), else as text (only
`=` and `!=`). A run whose orch.toml lacks the key, or cannot be read, fails the term.
"""

from __future__ import annotations

import operator
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.curves import RunColours
from workbench.files import layout
from workbench.tui.data import RunView

_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
    "=": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
}
# key, operator, value: the longest operators first, so `>=` is not read as `>`.
_KEY_TERM = re.compile(r"^([A-Za-z_][\w.\-]*)(>=|<=|!=|=|>|<)(.*)$")


class FilterError(ValueError):
    """A filter that cannot be applied (the message says which term and why)."""


@dataclass(frozen=True)
class KeyTerm:
    key: str
    op: str
    value: str

    def holds(self, config: dict[str, Any]) -> bool:
        found = [v for k, v in config.items() if k == self.key or k.endswith("." + self.key)]
        return any(self._compare(value) for value in found)

    def _compare(self, value: Any) -> bool:
        wanted, have = _number(self.value), _number(value)
        if wanted is not None and have is not None:
            return _COMPARISONS[self.op](have, wanted)
        if self.op not in ("=", "!="):
            return False
        same = str(value).lower() == self.value.lower()
        return same if self.op == "=" else not same


@dataclass(frozen=True)
class RunFilter:
    """A parsed filter: substrings of the run id and config comparisons, all to hold."""

    text: str
    substrings: tuple[str, ...]
    terms: tuple[KeyTerm, ...]

    @classmethod
    def parse(cls, text: str) -> RunFilter:
        substrings, terms = [], []
        for word in text.split():
            match = _KEY_TERM.match(word)
            if match is None:
                substrings.append(word.lower())
                continue
            key, op, value = match.groups()
            if not value:  # still being typed, or forgotten
                raise FilterError(f"{word}: a value is missing after {op}")
            if op not in ("=", "!=") and _number(value) is None:
                raise FilterError(f"{word}: {op} compares numbers; {value!r} is not one")
            terms.append(KeyTerm(key, op, value))
        return cls(text.strip(), tuple(substrings), tuple(terms))

    def keeps(self, run_id: str, config: Callable[[str], dict[str, Any]]) -> bool:
        lowered = run_id.lower()
        if not all(part in lowered for part in self.substrings):
            return False
        return all(term.holds(config(run_id)) for term in self.terms)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"loss": {"kind": "grpo"}}` -> `{"loss.kind": "grpo"}`."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class RunConfigs:
    """Each run's orch.toml, flattened; read again only when its mtime changes (a filter
    is applied at every poll: a stat per run, no parse)."""

    def __init__(self, experiment: Path) -> None:
        self.experiment = experiment
        self._read: dict[str, tuple[int, dict[str, Any]]] = {}

    def __call__(self, run_id: str) -> dict[str, Any]:
        path = layout.orch_config_path(layout.run_dir(self.experiment, run_id))
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return {}
        known = self._read.get(run_id)
        if known is None or known[0] != mtime:
            try:
                config = flatten(tomllib.loads(path.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                config = {}  # a broken orch.toml: the run's detail screen says why
            known = (mtime, config)
            self._read[run_id] = known
        return known[1]


class RunSelection:
    """Selected and pinned runs, the runs filter and the runs' colours, for every screen.

    `version` goes up at every change, so a screen can tell whether to redraw.
    """

    def __init__(self, experiment: Path) -> None:
        self._selected: dict[str, None] = {}  # in the order selected
        self._pinned: dict[str, None] = {}
        self.filter: RunFilter | None = None
        self.colours = RunColours()
        self.configs = RunConfigs(experiment)
        self.version = 0

    def is_selected(self, run_id: str) -> bool:
        return run_id in self._selected

    def is_pinned(self, run_id: str) -> bool:
        return run_id in self._pinned

    @property
    def selected(self) -> tuple[str, ...]:
        return tuple(self._selected)

    @property
    def pinned(self) -> tuple[str, ...]:
        return tuple(self._pinned)

    def toggle_selected(self, run_id: str) -> bool:
        """Select `run_id`, or unselect it if it was; True if it is selected now."""
        return self._toggle(self._selected, run_id)

    def toggle_pinned(self, run_id: str) -> bool:
        return self._toggle(self._pinned, run_id)

    def _toggle(self, marks: dict[str, None], run_id: str) -> bool:
        self.version += 1
        if run_id in marks:
            del marks[run_id]
            return False
        marks[run_id] = None
        return True

    def set_filter(self, text: str) -> None:
        """Filter the runs by `text` (see the module docstring); empty clears the filter.
        Raises FilterError, the filter left as it was, if a term cannot be applied."""
        parsed = RunFilter.parse(text) if text.strip() else None
        if parsed != self.filter:
            self.filter = parsed
            self.version += 1

    def shown(self, runs: Sequence[RunView]) -> list[RunView]:
        """The runs the filter keeps, in the runs table's order (`order`)."""
        return [run for run in self.order(runs) if self.keeps(run.id)]

    def order(self, runs: Sequence[RunView]) -> list[RunView]:
        """Pinned runs first (in the order pinned), then the rest in their order; every
        run gets its colour here, so colours go by every run, filtered out or not."""
        self.colours.assign([run.id for run in runs])
        if not self._pinned:
            return list(runs)
        pinned = {run.id: run for run in runs if run.id in self._pinned}
        first = [pinned[run_id] for run_id in self._pinned if run_id in pinned]
        return first + [run for run in runs if run.id not in pinned]

    def keeps(self, run_id: str) -> bool:
        return self.filter is None or self.filter.keeps(run_id, self.configs)

    def colour(self, run_id: str) -> str:
        return self.colours.colour(run_id)

    def selected_of(self, run_ids: Iterable[str]) -> list[str]:
        """The selected ones of `run_ids`, in their order."""
        return [run_id for run_id in run_ids if run_id in self._selected]
