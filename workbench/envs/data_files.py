"""Reading a local data file into rows: JSON Lines, CSV or Parquet, chosen by the file's suffix.

Every row keeps where it came from (`Row.where`: `file:line` for text formats, `file: row N`
for Parquet), so a problem found in a row later (a missing column, a reference answer that
is not a number) names the exact place to fix. JSON Lines and CSV are read with the standard
library; Parquet needs pyarrow (the `data` extra), imported only when a Parquet file is read.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.envs.base import EnvironmentConfigError

SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class Row:
    values: Mapping[str, Any]
    where: str
    """`path:line` (JSON Lines, CSV) or `path: row N` (Parquet), for error messages."""


def read_rows(path: Path) -> list[Row]:
    """Every row of `path`; `EnvironmentConfigError` naming the file (and line) if it cannot
    be read, has no rows, or a row is not a table of named values."""
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise EnvironmentConfigError(
            f"{path}: unknown data file type {path.suffix!r}; use one of "
            f"{', '.join(sorted(SUFFIXES))}"
        )
    if not path.is_file():
        raise EnvironmentConfigError(f"{path}: no such data file")
    rows = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}[kind](path)
    if not rows:
        raise EnvironmentConfigError(f"{path}: the data file has no rows")
    return rows


def _read_jsonl(path: Path) -> list[Row]:
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                values = json.loads(line)
            except json.JSONDecodeError as err:
                raise EnvironmentConfigError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(values, dict):
                raise EnvironmentConfigError(
                    f"{where}: each line must be a JSON object of columns, got "
                    f"{type(values).__name__}"
                )
            rows.append(Row(values, where))
    return rows


def _read_csv(path: Path) -> list[Row]:
    rows = []
    with path.open(encoding="utf-8", newline="") as text:
        reader = csv.DictReader(text)
        if not reader.fieldnames:
            return []
        for values in reader:
            # line_num is the last physical line read: the row's own line for one-line rows.
            where = f"{path}:{reader.line_num}"
            if None in values:
                raise EnvironmentConfigError(
                    f"{where}: more fields than the header's {len(reader.fieldnames)}"
                )
            rows.append(Row(dict(values), where))
    return rows


def _read_parquet(path: Path) -> list[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise EnvironmentConfigError(
            f"{path}: reading Parquet needs pyarrow: pip install 'workbench[data]'"
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise EnvironmentConfigError(f"{path}: cannot read the Parquet file ({err})") from None
    return [
        Row(values, f"{path}: row {number}")
        for number, values in enumerate(table.to_pylist(), start=1)
    ]
