"""`workbench serve RECIPE`: the experiment, as `workbench up --detach` starts it, with a
Tinker-compatible service among its processes (docs/guides/tinker.md).

The key and the bind are checked before anything is written or started, as `workbench web`
checks its token: beyond this machine's loopback a key must be given; one is made when none
is. The service's address and key are printed once.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer

from workbench.commands.common import EXIT_BAD_INPUT, fail, say, warn
from workbench.supervisor.tinker_service import (
    API_KEY_ENV,
    PROCESS_NAME,
    ServiceFile,
    service_file_path,
    write_service_file,
)
from workbench.system.ports import bind_error, is_loopback
from workbench.up import LaunchError, RecipeError, Report, launch_experiment, read_recipe

DEFAULT_PORT = 8780
# The SDK refuses keys that do not start so.
KEY_PREFIX = "tml-"
MIN_KEY_CHARS = 20
READY_TIMEOUT_S = 120.0


def checked_key(api_key: str | None, host: str) -> str:
    """The key clients must send: the one given (`tml-...`, long enough) or a new one
    (loopback only: serving beyond this machine is a choice made with a key of one's own)."""
    if not api_key:
        if not is_loopback(host):
            raise fail(
                f"--host {host} serves the Tinker API beyond this machine: give a key too "
                f"({API_KEY_ENV}=tml-... workbench serve --host {host}), or keep the default "
                "127.0.0.1 and reach it through an SSH tunnel",
                EXIT_BAD_INPUT,
            )
        return KEY_PREFIX + secrets.token_urlsafe(32)
    if not api_key.startswith(KEY_PREFIX) or len(api_key) < MIN_KEY_CHARS:
        raise fail(
            f"the API key given (--api-key or {API_KEY_ENV}) must start with {KEY_PREFIX!r} "
            f"(the tinker SDK refuses others) and have at least {MIN_KEY_CHARS} characters; "
            "give none and one is made",
            EXIT_BAD_INPUT,
        )
    return api_key


def serve(
    recipe: Annotated[
        Path, typer.Argument(help="Recipe TOML file, e.g. recipes/reverse_text.toml.")
    ],
    port: Annotated[
        int, typer.Option(min=1, max=65535, help="TCP port of the Tinker API.")
    ] = DEFAULT_PORT,
    host: Annotated[
        str,
        typer.Option(
            help="Address to bind. Any address but a loopback one (127.0.0.1, ::1, "
            "localhost) needs --api-key as well."
        ),
    ] = "127.0.0.1",
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar=API_KEY_ENV,
            help=f"The key clients give (tinker.ServiceClient(api_key=...)): starts with "
            f"'tml-', at least {MIN_KEY_CHARS} characters; without one a new key is made and "
            f"printed. Prefer setting {API_KEY_ENV}: an option is visible to other users in "
            "`ps`.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start an experiment from RECIPE with a Tinker-compatible API: code written for the
    `tinker` SDK trains on it unmodified.

    Starts what `workbench up RECIPE --detach` starts (the supervisor, vLLM, the shared
    trainer, the recipe's runs) and the service, a process of the experiment like the
    others: `workbench status` lists it, `workbench logs tinker` shows its log, `workbench
    down` stops it. Each training client a Tinker program makes is a run of the experiment
    (run_tinker_<hex>), trained beside the recipe's. The base URL and the API key are
    printed once, when the service answers: tinker.ServiceClient(base_url=..., api_key=...).
    """
    key = checked_key(api_key, host)
    problem = bind_error(host, port)
    if problem is not None:
        raise fail(
            f"cannot serve on {host}:{port}: {problem.strerror or problem}; "
            "choose another port with --port",
            EXIT_BAD_INPUT,
        )
    try:
        _, resolved = read_recipe(recipe)
    except RecipeError as err:
        raise fail(str(err), EXIT_BAD_INPUT) from None
    service = ServiceFile(host=host, port=port, api_key=key)
    experiment = Path(resolved.output_dir).resolve()
    previous = (
        service_file_path(experiment).read_bytes()
        if service_file_path(experiment).exists()
        else None
    )
    write_service_file(experiment, service)
    try:
        launch_experiment(recipe, Report(say=say, warn=warn), detach=True)
    except (RecipeError, LaunchError) as err:
        _restore(experiment, previous)
        raise fail(str(err), EXIT_BAD_INPUT if isinstance(err, RecipeError) else 1) from None
    _wait_until_answering(service)
    say(f"Tinker API of {experiment} at {service.base_url}")
    say(f"  base_url={service.base_url}")
    say(f"  api_key={key}  (shown once; it is in {service_file_path(experiment)}, mode 0600)")
    say(f"`workbench logs {PROCESS_NAME}` shows its log; `workbench down` stops it")


def _restore(experiment: Path, previous: bytes | None) -> None:
    """A start that failed leaves the experiment's service file as it was."""
    path = service_file_path(experiment)
    if previous is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(previous)


def _wait_until_answering(service: ServiceFile) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{service.base_url}/api/v1/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    say(
        f"the Tinker service did not answer in {READY_TIMEOUT_S:.0f} s; "
        f"see `workbench logs {PROCESS_NAME}` and `workbench status`"
    )
