"""Run ids for a sweep's runs: readable from their values, or a short index.

`value_ids` names a run by what it varies: `run_lr3e-3_rank8` (the last part of each
dotted key, the whole key with dashes when two last parts clash), `_seed8` for repeats.
Numbers keep three significant figures and a `p` for the decimal point (`0p7`), since
ids allow only letters, digits, `_` and `-`. `index_ids` numbers them: `run_sweep07`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from workbench.config import normalize_run_id
from workbench.files import layout

INDEX_PREFIX = "sweep"
MAX_READABLE_ID = 64
SIGNIFICANT_DIGITS = 3


def index_ids(count: int) -> list[str]:
    width = max(2, len(str(count - 1)))
    return [normalize_run_id(f"{INDEX_PREFIX}{i:0{width}d}") for i in range(count)]


def value_ids(runs: list[dict[str, Any]], keys: list[str]) -> tuple[list[str] | None, str]:
    """Ids made of each run's values of `keys`, or None and why they cannot be."""
    last = [key.split(".")[-1] for key in keys]
    labels = {
        key: (name if last.count(name) == 1 else key.replace(".", "-"))
        for key, name in zip(keys, last, strict=True)
    }
    ids = []
    for values in runs:
        parts = []
        for key in keys:
            shown = id_value(values[key])
            if shown is None:
                return None, f"{key} has values that do not fit in an id"
            parts.append(f"{labels[key]}{shown}")
        run_id = normalize_run_id("_".join(parts))
        if len(run_id) > MAX_READABLE_ID:
            return None, f"ids would be longer than {MAX_READABLE_ID} characters ({run_id})"
        if not layout.RUN_ID_PATTERN.match(run_id):
            return None, f"{run_id!r} is not a usable id"
        ids.append(run_id)
    duplicates = sorted({run_id for run_id in ids if ids.count(run_id) > 1})
    if duplicates:
        return None, f"two runs would both be {duplicates[0]} (values that round alike)"
    return ids, ""


def id_value(value: Any) -> str | None:
    """How a value reads inside a run id: `3e-3`, `0p7`, `8`, `true`; None if it cannot."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value == int(value) and abs(value) < 1e4:
            return str(int(value))
        if value != 0 and not 1e-2 <= abs(value) < 1e4:
            mantissa, exponent = f"{value:.{SIGNIFICANT_DIGITS - 1}e}".split("e")
            mantissa = mantissa.rstrip("0").rstrip(".")
            return f"{mantissa}e{int(exponent)}".replace(".", "p")
        return f"{value:.{SIGNIFICANT_DIGITS}g}".replace(".", "p")
    if isinstance(value, str):
        shown = re.sub(r"[^A-Za-z0-9_-]+", "-", value).strip("-")
        return shown or None
    return None
