"""`python -m workbench.orchestrator --run-dir DIR`: one run's orchestrator process.

Exit status: 0 the run finished its steps (or SIGTERM), 2 its config is invalid,
3 it was evicted (the reason is printed), 1 anything else.

A config that cannot work (its environment cannot be built with its `env_args`, as in a
`control/orch.toml` written by hand with `env = "nope"`) is found before anything is
waited for and rejects the run: `control/config_validation_error.txt` says why, as when
the trainer rejects a config, so the run shows as rejected, the trainer frees its slot
and the supervisor keeps its orchestrator stopped until `orch.toml` changes.

What the supervisor does next (`supervisor/daemon.py`, under `ORCHESTRATOR_RESTART` of
`supervisor/plan.py`): whatever the status, a run that is now evicted, rejected or deleted
keeps its orchestrator stopped, and a finished run leaves it exited. Otherwise 0 leaves it
down; 2 and 3 mark it failed at once, since starting it again cannot help; any other
status, or death by a signal, restarts it after a backoff (1 s, doubling up to 30 s), at
most 5 times in a row (a run that stayed up 60 s starts the count afresh), then marks it
failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

from workbench.config import (
    ConfigError,
    ConfigProblem,
    OrchestratorConfig,
    load_orchestrator_config,
)
from workbench.envs import Environment, EnvironmentConfigError
from workbench.envs.checks import checked_environment
from workbench.files import busy, layout, run_control
from workbench.files.endpoint import Endpoint, read_endpoint
from workbench.inference.client import AdapterVersions, InferenceClient
from workbench.inference.readiness import is_healthy
from workbench.orchestrator.loop import Orchestrator, RunEvicted
from workbench.orchestrator.state import remove_killed_writes
from workbench.system.lifeline import die_with_parent
from workbench.system.priority import run_as_batch

logger = logging.getLogger("workbench.orchestrator")
EXIT_BAD_CONFIG = 2
EXIT_EVICTED = 3
QUIET_LOGGERS = ("httpx", "httpcore")


class Stopped(Exception):
    pass


def _raise_stopped(signum, frame):
    raise Stopped()


def wait_until(condition, run: Path, what: str, poll_s: float) -> None:
    """Poll until `condition()`; logs once what it waits for; stops if the run is evicted."""
    logged = False
    while not condition():
        eviction = run_control.read_eviction(run)
        if eviction is not None:
            raise RunEvicted(eviction.reason)
        if not logged:
            logger.info("waiting for %s", what)
            logged = True
        time.sleep(poll_s)


def configure_logging() -> None:
    """INFO lines to stderr (the run's orchestrator.log): one per step, evals, waits.

    HTTP clients log every request at INFO (httpx: `HTTP Request: POST .../v1/chat/
    completions`), dozens per step: only their warnings get through."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.orchestrator", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--poll-s", type=float, default=0.2)
    args = parser.parse_args(argv)
    configure_logging()
    signal.signal(signal.SIGTERM, _raise_stopped)
    die_with_parent()  # a SIGTERM when the supervisor dies, as on `workbench down`
    run_as_batch()
    supervisor = os.getppid()
    run: Path = args.run_dir
    experiment = run.parent
    remove_killed_writes(run)  # of an orchestrator of this run killed mid-write
    busy.record_to(experiment, run.name)
    read = None  # which orch.toml the config came from, once read
    env = None  # the run's environment, once built and checked
    try:
        wait_until(layout.orch_config_path(run).is_file, run, "control/orch.toml", args.poll_s)
        # The trainer may reject a config our own validation accepts (its hooks): write
        # nothing for a rejected run; go on once the config is fixed and accepted.
        wait_until(
            lambda: run_control.read_validation_error(run) is None,
            run,
            "the trainer to accept the config (see control/config_validation_error.txt)",
            args.poll_s,
        )
        config_path = layout.orch_config_path(run)
        read = run_control.current_config_signature(run)  # before reading: an edit retries
        config = load_orchestrator_config(config_path)
        env, problem = checked_environment(config)
        if problem is not None:
            raise ConfigError(config_path, [ConfigProblem(key=problem[0], message=problem[1])])
        endpoint = _wait_for_inference(run, args.poll_s)
        _train_until_done(run, config, env, endpoint, supervisor, args.poll_s)
    except (ConfigError, EnvironmentConfigError) as err:
        # A bad env or env_args (or a task space too small to hold out eval prompts) fails
        # the same way on every restart: a rejected config, not a crash.
        print(f"error: {err}", file=sys.stderr)
        if read is not None:
            run_control.write_validation_error(run, str(err), read)
        return EXIT_BAD_CONFIG
    except RunEvicted as err:
        print(f"{run.name} evicted: {err}", file=sys.stderr)
        return EXIT_EVICTED
    except (Stopped, KeyboardInterrupt):
        # The supervisor stops an evicted run's orchestrator at once rather than waiting
        # for its next iteration: say why it stopped.
        eviction = run_control.read_eviction(run)
        if eviction is not None:
            print(f"{run.name} evicted: {eviction.reason}", file=sys.stderr)
            return EXIT_EVICTED
        logger.info("stopped by signal; state is checkpointed after every step")
        return 0
    finally:
        if env is not None:
            env.close()  # a verifiers environment's process
    return 0


def _wait_for_inference(run: Path, poll_s: float) -> Endpoint:
    """The server's endpoint, once the supervisor wrote it and the server answers."""
    experiment = run.parent
    wait_until(
        lambda: read_endpoint(experiment) is not None, run, "supervisor/endpoint.json", poll_s
    )
    endpoint = read_endpoint(experiment)
    wait_until(
        lambda: is_healthy(endpoint.server_url), run, f"inference at {endpoint.server_url}", 1.0
    )
    return endpoint


def _train_until_done(
    run: Path,
    config: OrchestratorConfig,
    env: Environment,
    endpoint: Endpoint,
    supervisor: int,
    poll_s: float,
) -> None:
    """The run's steps until it is done, its adapter versions unloaded at the end while
    the supervisor (pid `supervisor`) is still there."""
    with InferenceClient(endpoint) as client:
        adapters = AdapterVersions(client, run.name)
        try:
            Orchestrator(run, config, client, adapters, poll_s=poll_s, env=env).run_until_done()
        finally:
            # With the supervisor gone vLLM is stopping too (it got the same SIGTERM):
            # unloading would wait on a server that no longer answers.
            if os.getppid() == supervisor:
                adapters.unload_all()


if __name__ == "__main__":
    code = main()
    busy.flush()  # os._exit below skips the exit hooks that would write it
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: that joins the generation threads, which may wait on requests that a
    # server stopping at the same time (its supervisor died) never answers. Every state
    # worth keeping is already written (atomically, after each step).
    os._exit(code)
