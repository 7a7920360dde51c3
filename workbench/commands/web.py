"""`workbench web`: the TUI of an experiment served to a browser (`workbench.tui.web`).

Checks the bind and the token before anything is served (another address than this
machine's loopback needs a token given; one is made when none is; the port must be free),
prints the page's address with the token in it once, as Jupyter does, and how to tunnel to
it, then serves until Ctrl-C.
"""

from __future__ import annotations

import getpass
import secrets
import socket
from typing import Annotated
from urllib.parse import urlencode

import typer

from workbench.commands.common import EXIT_BAD_INPUT, ExperimentArg, experiment_or_fail, fail, say
from workbench.supervisor.client import running_supervisor_pid
from workbench.system.ports import bind_error, is_loopback

DEFAULT_PORT = 8765
TOKEN_ENV = "WORKBENCH_WEB_TOKEN"
# Any local user of a shared machine can reach 127.0.0.1: the token is all that keeps them
# from the TUI's keys (evict, stop all), so a short one, quickly guessed, is refused.
MIN_TOKEN_CHARS = 16


def page_url(host: str, port: int) -> str:
    """Where a browser opens the page: a wildcard bind (0.0.0.0, ::) by this machine's name."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def token_url(host: str, port: int, token: str) -> str:
    """The page's address carrying the token: the server (`workbench.tui.web`) answers its
    first visit with a session cookie."""
    return f"{page_url(host, port)}?{urlencode({'token': token})}"


def tunnel_line(port: int) -> str:
    """The SSH command that brings a loopback-bound page to another machine's browser."""
    return (
        f"from another machine: ssh -N -L {port}:127.0.0.1:{port} "
        f"{getpass.getuser()}@{socket.gethostname()}, then open the address above there"
    )


def checked_token(token: str | None, host: str) -> str:
    """The token the page asks for: the one given, long enough, or a new one (loopback
    only: serving beyond this machine is a choice the user makes with a token of theirs)."""
    if token is None or token == "":
        if not is_loopback(host):
            raise fail(
                f"--host {host} serves the TUI beyond this machine: give a token too "
                f"({TOKEN_ENV}=... workbench web --host {host}), or keep the default "
                "127.0.0.1 and open it through an SSH tunnel",
                EXIT_BAD_INPUT,
            )
        return secrets.token_urlsafe(32)
    if len(token) < MIN_TOKEN_CHARS:
        raise fail(
            f"the token given (--token or {TOKEN_ENV}) has {len(token)} characters; give one "
            f"of at least {MIN_TOKEN_CHARS} ({TOKEN_ENV}=$(python -c 'import secrets; "
            "print(secrets.token_urlsafe())')), or none: workbench web then makes one",
            EXIT_BAD_INPUT,
        )
    return token


# The options of `web`, named once so its signature reads as its parameters.
PortOption = Annotated[int, typer.Option(min=1, max=65535, help="TCP port to serve the page on.")]
HostOption = Annotated[
    str,
    typer.Option(
        help="Address to bind. Any address but a loopback one (127.0.0.1, ::1, "
        "localhost) needs --token as well."
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        envvar=TOKEN_ENV,
        help=f"The token the page asks for before it shows anything, at least "
        f"{MIN_TOKEN_CHARS} characters; without one a new token is made and printed in "
        f"the page's address. Prefer setting {TOKEN_ENV}: an option is visible to other "
        "users in `ps`.",
        show_default=False,
    ),
]


def web(
    experiment: ExperimentArg = None,
    port: PortOption = DEFAULT_PORT,
    host: HostOption = "127.0.0.1",
    token: TokenOption = None,
) -> None:
    """Serve the TUI to a browser: the same screens and keys, for a running experiment or a
    finished one.

    By default the page is served on 127.0.0.1 only, and the command prints the address to
    open, with a token made for this server in it (?token=...), and an SSH tunnel line to
    copy for opening it from another machine. The first visit to that address keeps a
    cookie, and the page works without the token after; a browser without either is asked
    for the token, and nothing is served before it is given: another user of this machine
    can reach 127.0.0.1 too. A token of your own (--token or WORKBENCH_WEB_TOKEN, at least
    16 characters) replaces the made one, and binding another address (--host 0.0.0.0)
    needs one.

    Each browser tab runs its own TUI. Closing the tab, or `q` in it, closes that TUI only:
    the experiment runs on, as after `q` in a terminal. Ctrl-C stops serving (and every tab's
    TUI), never the experiment. Needs textual-serve: pip install -e '.\\[web]'.
    """
    path = experiment_or_fail(experiment).resolve()
    token = checked_token(token, host)
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
    say(f"open {token_url(host, port, token)} (the token is the key to this experiment's TUI)")
    if is_loopback(host):
        say(tunnel_line(port))
    if running_supervisor_pid(path) is None:
        say("no supervisor is running: the page shows the experiment as it was left")
    say("Ctrl-C stops serving; the experiment runs on")
    WorkbenchWebServer(path, host, port, token).serve()
