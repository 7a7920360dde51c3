"""What every route of the Tinker-compatible service shares: its settings, the error it
raises for a client's mistake (a Tinker-style JSON body with a 4xx status), and reading a
JSON body and its fields."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from workbench.tinker import wire


@dataclass(frozen=True)
class ServiceSettings:
    experiment: Path
    api_key: str
    base_model: str  # the recipe's [model] base, as clients name it
    tokenizer_dir: str  # where get_tokenizer loads the served model's tokenizer offline
    trainer_rank: int  # `[trainer] lora.rank`: the most a model may ask for
    session_timeout_s: float = 120.0


class TinkerError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "category": "user", "detail": message}, status)


def bearer(request: Request) -> str | None:
    value = request.headers.get("authorization", "")
    return value[7:] if value.lower().startswith("bearer ") else None


async def read_json(request: Request) -> dict[str, Any]:
    raw = wire.decompressed(await request.body(), request.headers.get("content-encoding"))
    try:
        document = json.loads(raw or b"{}")
    except ValueError as err:
        raise TinkerError(400, f"the body is not JSON: {err}") from None
    if not isinstance(document, dict):
        raise TinkerError(400, "the body must be a JSON object")
    return document


def field(document: dict[str, Any], key: str, kind: type = str) -> Any:
    value = document.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TinkerError(400, f"`{key}` must be a {kind.__name__} (got {value!r})")
    return value
