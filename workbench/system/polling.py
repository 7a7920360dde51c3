"""Waiting for something another process does: poll until it holds or a deadline passes.

Files and processes here have no change notification to wait on that works across every
filesystem and process the project starts, so benchmarks and tests poll. The interval is
short by default (20 ms) because what they wait for is usually quick and a benchmark's
figure includes the wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.02
) -> Any:
    """Call `condition` every `every_s` until it returns something truthy, and return that;
    raise TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(every_s)
