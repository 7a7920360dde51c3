"""`workbench web`: the TUI of an experiment served to a browser (`workbench.tui.web`).

Checks the bind before anything is served (another address than this machine's loopback
needs a token; the port must be free), says where to open the page and how to tunnel to
it, then serves until Ctrl-C.
"""

from __future__ import annotations

import getpass
import socket
from typing import Annotated

import typer

from workbench.commands.common import EXIT_BAD_INPUT, ExperimentArg, experiment_or_fail, fail, say
from workbench.supervisor.client import running_supervisor_pid
from workbench.system.ports import bind_error, is_loopback

DEFAULT_PORT = 8765
TOKEN_ENV = "WORKBENCH_WEB_TOKEN"


def page_url(host: str, port: int) -> str:
    """Where a browser opens the page: a wildcard bind (0.0.0.0, ::) by this machine's name."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def tunnel_line(port: int) -> str:
    """The SSH command that brings a loopback-bound page to another machine's browser."""
    return (
        f"from another machine: ssh -N -L {port}:127.0.0.1:{port} "
        f"{getpass.getuser()}@{socket.gethostname()}, then open http://127.0.0.1:{port}/ there"
    )


def web(
    experiment: ExperimentArg = None,
    port: Annotated[
        int, typer.Option(min=1, max=65535, help="TCP port to serve the page on.")
    ] = DEFAULT_PORT,
    host: Annotated[
        str,
        typer.Option(
            help="Address to bind. Any address but a loopback one (127.0.0.1, ::1, "
            "localhost) needs --token as well."
        ),
    ] = "127.0.0.1",
    token: Annotated[
        str | None,
        typer.Option(
            envvar=TOKEN_ENV,
            help=f"The token the page asks for before it shows anything. Prefer setting "
            f"{TOKEN_ENV}: an option is visible to other users in `ps`.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the TUI to a browser: the same screens and keys, for a running experiment or a
    finished one.

    By default the page is served on 127.0.0.1 only, and the command prints the address to
    open and an SSH tunnel line to copy for opening it from another machine. Binding another
    address (--host 0.0.0.0) needs a token (--token or WORKBENCH_WEB_TOKEN); the page then
    asks for it, and without it nothing is served. Given on 127.0.0.1, a token is asked for
    there too.

    Each browser tab runs its own TUI. Closing the tab, or `q` in it, closes that TUI only:
    the experiment runs on, as after `q` in a terminal. Ctrl-C stops serving (and every tab's
    TUI), never the experiment. Needs textual-serve: pip install -e '.\\[web]'.
    """
    path = experiment_or_fail(experiment).resolve()
    if not is_loopback(host) and not token:
        raise fail(
            f"--host {host} serves the TUI beyond this machine: give a token too "
            f"({TOKEN_ENV}=... workbench web --host {host}), or keep the default 127.0.0.1 "
            "and open it through an SSH tunnel",
            EXIT_BAD_INPUT,
        )
    try:
        from workbench.tui.web import WorkbenchWebServer
    except ImportError:
        raise fail("textual-serve is not installed: pip install -e '.[web]'") from None
    problem = bind_error(host, port)
    if problem is not None:
        raise fail(
            f"cannot serve on {host}:{port}: {problem.strerror or problem}; "
            "choose another port with --port",
            EXIT_BAD_INPUT,
        )

    say(f"serving the TUI of {path} on {page_url(host, port)}")
    if token:
        say("the page asks for the token first")
    if is_loopback(host):
        say(tunnel_line(port))
    if running_supervisor_pid(path) is None:
        say("no supervisor is running: the page shows the experiment as it was left")
    say("Ctrl-C stops serving; the experiment runs on")
    WorkbenchWebServer(path, host, port, token).serve()
