"""Where the inference server listens and the key it wants: `supervisor/endpoint.json`.

Written (mode 0600: the key guards the runtime LoRA-loading endpoint) by whoever starts
the server, read by every orchestrator of the experiment.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.files import layout


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # e.g. http://127.0.0.1:8000/v1
    api_key: str
    model: str  # the served name of the base model

    @property
    def server_url(self) -> str:
        """The server root (health, LoRA loading), without the `/v1` suffix."""
        return self.base_url.removesuffix("/").removesuffix("/v1")


def endpoint_path(experiment: Path) -> Path:
    return layout.supervisor_dir(experiment) / "endpoint.json"


def new_api_key() -> str:
    return secrets.token_urlsafe(24)


def write_endpoint(experiment: Path, endpoint: Endpoint) -> Path:
    path = endpoint_path(experiment)
    layout.atomic_write_text(path, json.dumps(asdict(endpoint), indent=2) + "\n", mode=0o600)
    return path


def read_endpoint(experiment: Path) -> Endpoint | None:
    try:
        data = json.loads(endpoint_path(experiment).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return Endpoint(base_url=data["base_url"], api_key=data["api_key"], model=data["model"])
