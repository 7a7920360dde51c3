"""Wait for the inference server to answer its health endpoint, or explain why it died."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from workbench.system.file_tail import last_lines


class InferenceStartError(RuntimeError):
    """The server died or never became ready; the message quotes the end of its log."""


def is_healthy(server_url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{server_url}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until_ready(
    server_url: str,
    *,
    process: subprocess.Popen | None = None,
    log_path: Path | None = None,
    timeout_s: float = 600.0,
    poll_s: float = 1.0,
) -> float:
    """Block until `GET {server_url}/health` answers 200; returns the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if is_healthy(server_url):
            return time.monotonic() - started
        if process is not None and process.poll() is not None:
            raise InferenceStartError(
                f"the inference server exited with code {process.returncode} while starting."
                + _log_excerpt(log_path)
            )
        time.sleep(poll_s)
    raise InferenceStartError(
        f"the inference server was not ready after {timeout_s:.0f} s "
        "(raise [inference] startup_timeout_s if the model is large)." + _log_excerpt(log_path)
    )


def _log_excerpt(log_path: Path | None) -> str:
    if log_path is None:
        return ""
    lines = last_lines(log_path, 30)
    if not lines:
        return f" Its log ({log_path}) is empty."
    return f" Last lines of {log_path}:\n" + "".join(f"{line}\n" for line in lines)
