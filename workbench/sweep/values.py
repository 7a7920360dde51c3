"""Swept values: dotted keys (`lora.rank`) and their values, as tables and as text.

A sweep speaks of settings by dotted key; a run's config is nested tables. These helpers
go between the two and show values the way a recipe spells them.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from workbench.config import nest_dotted


def nested(values: dict[str, Any]) -> dict[str, Any]:
    """`{"lora.rank": 8}` -> `{"lora": {"rank": 8}}`, ready to deep-merge into `[defaults]`."""
    return merged({}, values)


def merged(defaults: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of `defaults` with each dotted value set (nested tables merge key by key)."""
    result = copy.deepcopy(defaults)
    for key, value in values.items():
        _merge_into(result, nest_dotted(key, copy.deepcopy(value)))
    return result


def _merge_into(target: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_into(target[key], value)
        else:
            target[key] = value


def flatten_values(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"lora": {"rank": 8}}` -> `{"lora.rank": 8}`; an empty table stays a value."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_values(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def describe_values(values: dict[str, Any]) -> str:
    """`lr=0.003 lora.rank=8`, for tables, logs and orch.toml headers."""
    return " ".join(f"{key}={show_value(value)}" for key, value in values.items())


def show_value(value: Any) -> str:
    """A value as a recipe would spell it (TOML-like), for messages and tables."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {show_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    return str(value)
