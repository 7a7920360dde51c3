"""The TUI served to a browser (`workbench web`): textual-serve behind a token.

textual-serve runs a command per browser connection and streams that process's screen to
the page: here `python -m workbench.tui EXPERIMENT`, the very TUI a terminal gets, with its
keys and screens. Closing the tab ends that connection's TUI only, as `q` does in a
terminal; the supervisor and its runs are never signalled from here.

Who may connect:
- only a browser that gave the token: in the address `workbench web` prints (`/?token=...`,
  as Jupyter's), or typed into the page. Every user of a shared machine can open its
  loopback port, so a loopback bind is no key by itself. The browser then holds a cookie
  with this server's session key, never the token.
- bound to a loopback address (the default), only this machine, or an SSH tunnel from
  elsewhere. Requests naming another host are refused, so a web page whose name resolves
  to 127.0.0.1 (DNS rebinding) cannot reach it.
- a websocket opened by another site's page is refused whatever the bind (its Origin names
  that site), so a page in the same browser cannot drive the TUI.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import shlex
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp_jinja2
from aiohttp import web
from textual_serve.server import Server, to_int

from workbench.system.lifeline import PARENT_PID_ENV
from workbench.system.ports import is_loopback

SESSION_COOKIE = "workbench_session"
SIGN_IN_PATH = "/sign-in"
TOKEN_QUERY = "token"  # /?token=... (`workbench.commands.web.token_url`)
# A wrong token is answered this late: guessing a short one takes that long a try.
WRONG_TOKEN_DELAY_S = 1.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def tui_command(experiment: Path) -> str:
    """The shell command textual-serve runs for each browser connection: this Python, so
    the TUI is the same install's. `exec` makes the TUI this server's own child, which
    then dies with it (`die_with_parent`): a server killed outright leaves no TUI behind
    (textual's web driver does not quit when its input ends)."""
    command = shlex.join([sys.executable, "-m", "workbench.tui", str(experiment)])
    return f"{PARENT_PID_ENV}={os.getpid()} exec {command}"


def sign_in_page(wrong: bool) -> str:
    """The page a browser without the session cookie gets: it asks for the token."""
    problem = '<p class="wrong">wrong token</p>' if wrong else ""
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>workbench: token</title>
<style>
body {{ background: #0c181f; color: #eee; font-family: monospace; display: flex;
       justify-content: center; align-items: center; height: 100vh; margin: 0; }}
form {{ background: #12232d; padding: 32px; }}
input, button {{ font: inherit; padding: 8px; margin-top: 12px; }}
.wrong {{ color: #ff6b6b; }}
</style></head>
<body><form method="post" action="{SIGN_IN_PATH}">
<div>This workbench asks for the token <code>workbench web</code> was started with.</div>
{problem}
<label>token <input type="password" name="token" id="token" autofocus></label>
<button type="submit" id="sign-in">open</button>
</form></body></html>
"""


class WorkbenchWebServer(Server):
    """textual-serve's server for one experiment's TUI, with the checks above."""

    def __init__(self, experiment: Path, host: str, port: int, token: str) -> None:
        super().__init__(tui_command(experiment), host=host, port=port, title=experiment.name)
        self.token = token
        self.loopback_only = is_loopback(host)
        # What the cookie holds: new each time the server starts, so a restart signs out.
        self._session_key = secrets.token_urlsafe(32)
        # The tasks serving open pages: Ctrl-C ends them (each quits its TUI), rather than
        # aiohttp waiting for every browser to hang up.
        self._page_tasks: set[asyncio.Task[Any]] = set()

    def initialize_logging(self) -> None:
        # Problems only (a TUI that failed to start); not a line per request.
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

    async def on_startup(self, app: web.Application) -> None:
        """Nothing to print: `workbench web` says where to open before serving."""

    async def on_shutdown(self, app: web.Application) -> None:
        for task in list(self._page_tasks):
            task.cancel()

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._check_request)
        app.router.add_post(SIGN_IN_PATH, self._sign_in)
        return app

    @web.middleware
    async def _check_request(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.loopback_only and not is_loopback(request.url.host or ""):
            raise web.HTTPForbidden(
                text=f"this workbench serves loopback only: open http://127.0.0.1:{self.port}/"
            )
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.host:
            raise web.HTTPForbidden(text="requests from another site's page are refused")
        if request.path == SIGN_IN_PATH or self._signed_in(request):
            return await self._serve(request, handler)
        if request.path == "/" and TOKEN_QUERY in request.query:
            return await self._token_in_address(request)
        if request.path == "/":
            return web.Response(
                text=sign_in_page(wrong=False), content_type="text/html", status=401
            )
        raise web.HTTPUnauthorized(text="open / and give the token first")

    async def _serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        task = asyncio.current_task()
        if request.path != "/ws" or task is None:
            return await handler(request)
        self._page_tasks.add(task)
        try:
            return await handler(request)
        finally:
            self._page_tasks.discard(task)

    def _signed_in(self, request: web.Request) -> bool:
        cookie = request.cookies.get(SESSION_COOKIE, "")
        return hmac.compare_digest(cookie.encode(), self._session_key.encode())

    async def _sign_in(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        return await self._answer_token(str(form.get("token", "")), "/")

    async def _token_in_address(self, request: web.Request) -> web.StreamResponse:
        # The page again without the token, so that it leaves the address bar (and the
        # browser's history); the page's other parameters (fontsize) are kept.
        kept = [(key, value) for key, value in request.query.items() if key != TOKEN_QUERY]
        then = request.rel_url.with_query(kept)
        return await self._answer_token(request.query[TOKEN_QUERY], str(then))

    async def _answer_token(self, given: str, then: str) -> web.StreamResponse:
        """Signed in (the session cookie, and a redirect to `then`) or the sign-in page
        saying the token was wrong, a second late."""
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            await asyncio.sleep(WRONG_TOKEN_DELAY_S)
            return web.Response(text=sign_in_page(wrong=True), content_type="text/html", status=403)
        response = web.Response(status=303, headers={"Location": then})
        response.set_cookie(
            SESSION_COOKIE, self._session_key, httponly=True, samesite="Strict", path="/"
        )
        return response

    @aiohttp_jinja2.template("app_index.html")
    async def handle_index(self, request: web.Request) -> dict[str, Any]:
        # textual-serve's own page names the bound address (0.0.0.0 is no place to open a
        # websocket to); the page's own host and port, as the browser reached them (through
        # a tunnel, another port), work wherever it is opened.
        websocket_scheme = "wss" if request.scheme == "https" else "ws"
        return {
            "font_size": to_int(request.query.get("fontsize", "16"), 16),
            "app_websocket_url": f"{websocket_scheme}://{request.host}/ws",
            "config": {"static": {"url": f"{request.scheme}://{request.host}/static/"}},
            "application": {"name": self.title},  # escaped by the template
        }
