"""Security checks on a running experiment, reported beside the faults.

- listening TCP sockets: only vLLM's server and the trainer (torchrun's store, gloo's ranks),
  each with its process family, and only on 127.0.0.1;
- vLLM refuses a request without the experiment's API key and answers one with it;
- the supervisor directory, the control socket, endpoint.json (the key) are the owner's;
- `workbench runs add` refuses ids with path tricks, control characters or huge sizes.

Each failed check is one line in the returned list.
"""

from __future__ import annotations

import contextlib
import stat
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from workbench.bench.faults.experiment import FaultExperiment, still_alive
from workbench.files.endpoint import endpoint_path, read_endpoint
from workbench.supervisor import paths

# The processes that may listen, each on 127.0.0.1 only.
LISTENERS = ("inference", "trainer")
BAD_RUN_IDS = ("../escape", "a/b", "run_\x1b[2Jx", "x" * 10_000, ".", "")


def listening_problems(exp: FaultExperiment) -> list[str]:
    """Every listening TCP socket of the experiment: only vLLM's and the trainer's process
    families may listen (the API; torchrun's store and gloo's ranks), on 127.0.0.1 only."""
    exp.record_processes()
    owners = {pid: name for name in LISTENERS for pid in _family(exp.child_pid(name))}
    problems = []
    for seen in exp.seen.values():
        if not still_alive(seen):
            continue
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(seen.pid).net_connections(kind="tcp"):
                if conn.status != psutil.CONN_LISTEN:
                    continue
                where = f"{conn.laddr.ip}:{conn.laddr.port}"
                owner = owners.get(seen.pid)
                if owner is None:
                    problems.append(f"pid {seen.pid} ({seen.command[:60]}) listens on {where}")
                elif conn.laddr.ip != "127.0.0.1":
                    problems.append(f"{owner} (pid {seen.pid}) listens on {where}, not 127.0.0.1")
    return problems


def _family(pid: int | None) -> set[int]:
    """`pid` and its descendants."""
    with contextlib.suppress(psutil.Error):
        if pid is not None:
            process = psutil.Process(pid)
            return {process.pid, *(p.pid for p in process.children(recursive=True))}
    return set()


def api_key_problems(exp: FaultExperiment) -> list[str]:
    endpoint = read_endpoint(exp.path)
    if endpoint is None:
        return ["no endpoint.json"]
    url = f"{endpoint.base_url}/models"
    problems = []
    for key, expected in ((None, 401), ("wrong-key", 401), (endpoint.api_key, 200)):
        request = urllib.request.Request(url)
        if key is not None:
            request.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status = response.status
        except urllib.error.HTTPError as err:
            status = err.code
        except OSError as err:
            problems.append(f"GET {url}: {err}")
            continue
        if status != expected:
            who = (
                "no key"
                if key is None
                else ("a wrong key" if key != endpoint.api_key else "the key")
            )
            problems.append(f"GET {url} with {who}: {status}, expected {expected}")
    return problems


def permission_problems(exp: FaultExperiment) -> list[str]:
    problems = []
    wanted = {
        paths.socket_path(exp.path).parent: 0o700,
        paths.socket_path(exp.path): None,  # inside the 0700 directory; any mode
        endpoint_path(exp.path): 0o600,
    }
    for path, mode in wanted.items():
        try:
            actual = stat.S_IMODE(Path(path).stat().st_mode)
        except OSError as err:
            problems.append(f"{path}: {err.strerror}")
            continue
        if mode is not None and actual & ~mode:
            problems.append(f"{path}: mode {actual:o}, expected at most {mode:o}")
    return problems


def run_id_problems(exp: FaultExperiment) -> list[str]:
    problems = []
    before = sorted(p.name for p in exp.path.iterdir())
    for bad in BAD_RUN_IDS:
        result = exp.cli("runs", "add", bad, "--experiment", str(exp.path), timeout=60)
        if result.returncode != 2 or not result.stderr.strip():
            shown = repr(bad[:20])
            problems.append(f"runs add {shown}: exit {result.returncode}, {result.stderr[:80]!r}")
    if (
        sorted(p.name for p in exp.path.iterdir()) != before
        or (exp.path.parent / "escape").exists()
    ):
        problems.append("a refused runs add still wrote something")
    return problems


def security_problems(exp: FaultExperiment) -> list[str]:
    return [
        *listening_problems(exp),
        *api_key_problems(exp),
        *permission_problems(exp),
        *run_id_problems(exp),
    ]
