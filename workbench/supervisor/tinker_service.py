"""The Tinker service as a process of the experiment: `workbench serve` writes
`supervisor/tinker.json` (mode 0600: it holds the API key) and the supervisor's plan then
runs `python -m workbench.tinker` beside vLLM and the trainer, so `workbench status` lists
it, a crash restarts it and `workbench down` stops it. An experiment started so keeps its
service when `workbench up` starts it again.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.files import layout
from workbench.supervisor.policy import RestartPolicy
from workbench.supervisor.process import HttpReady, ProcessSpec
from workbench.system.lifeline import PARENT_PID_ENV

API_KEY_ENV = "WORKBENCH_TINKER_API_KEY"
PROCESS_NAME = "tinker"
# `2` is "my setup is wrong" (no key): restarting cannot help.
RESTART = RestartPolicy(
    mode="always",
    max_restarts=3,
    backoff_initial_s=1.0,
    backoff_max_s=30.0,
    permanent_exit_codes=(2,),
)


@dataclass(frozen=True)
class ServiceFile:
    host: str
    port: int
    api_key: str

    @property
    def base_url(self) -> str:
        """Where clients of this machine reach it (a wildcard bind through loopback)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = "::1" if host == "::" else host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


def service_file_path(experiment: Path) -> Path:
    return layout.supervisor_dir(experiment) / "tinker.json"


def write_service_file(experiment: Path, service: ServiceFile) -> Path:
    path = service_file_path(experiment)
    layout.atomic_write_text(path, json.dumps(asdict(service), indent=2) + "\n", mode=0o600)
    return path


def read_service_file(experiment: Path) -> ServiceFile | None:
    try:
        data = json.loads(service_file_path(experiment).read_text(encoding="utf-8"))
        return ServiceFile(host=data["host"], port=int(data["port"]), api_key=data["api_key"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def service_spec(experiment: Path) -> ProcessSpec | None:
    """The service's process when `workbench serve` asked for one, else None. Its key goes
    through the environment, never the command line (which other users can read)."""
    service = read_service_file(experiment)
    if service is None:
        return None
    argv = [sys.executable, "-m", "workbench.tinker", str(experiment)]
    argv += ["--host", service.host, "--port", str(service.port)]
    return ProcessSpec(
        name=PROCESS_NAME,
        kind=PROCESS_NAME,
        argv=argv,
        log_path=layout.process_log_path(experiment, PROCESS_NAME),
        env={API_KEY_ENV: service.api_key, PARENT_PID_ENV: str(os.getpid())},
        readiness=HttpReady(f"{service.base_url}/api/v1/healthz"),
        ready_timeout_s=120.0,
        restart=RESTART,
        stop_timeout_s=20.0,
    )
