"""`workbench web` in a real browser: Debian's headless Chromium, driven by playwright, opens
the page the command serves and reads what the page's terminal shows.

The page draws the TUI on a canvas (xterm.js); what it shows is read from xterm's own
screen buffer, caught by a script the page runs before its own (`CATCH_TERMINAL`).
Screenshots of each screen go to $DOCS_SCREENSHOTS when set (docs/guides/web.md's
pictures), else to the test's temporary directory.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.tui import synthetic
from workbench.supervisor import paths
from workbench.system.ports import free_port, is_loopback

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = "correct-horse-battery"

# The page's terminal is a module variable of its script; the first object given a
# `terminal` property that has a screen buffer is it: keep it where the test can read it.
CATCH_TERMINAL = """
Object.defineProperty(Object.prototype, "terminal", {
  configurable: true,
  set(value) {
    if (value && value.buffer && !window.__terminal) { window.__terminal = value; }
    Object.defineProperty(this, "terminal",
      {value, writable: true, configurable: true, enumerable: true});
  },
});
"""
SCREEN_TEXT = """() => {
  const terminal = window.__terminal;
  if (!terminal) return "";
  const buffer = terminal.buffer.active;
  const lines = [];
  for (let row = 0; row < terminal.rows; row++) {
    const line = buffer.getLine(buffer.viewportY + row);
    lines.push(line ? line.translateToString(true) : "");
  }
  return lines.join("\\n");
}"""


def test_only_loopback_addresses_count_as_this_machine():
    for host in ("127.0.0.1", "127.0.1.1", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.5", "example.com", ""):
        assert not is_loopback(host), host


def web_command(experiment: Path, *args: str) -> list[str]:
    """The installed `workbench` command (this repo's code first on its path)."""
    return [str(Path(sys.executable).parent / "workbench"), "web", str(experiment), *args]


def run_web(experiment: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        web_command(experiment, *args),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), "WORKBENCH_WEB_TOKEN": ""},
    )


@pytest.fixture
def stand_in_supervisor() -> Iterator[subprocess.Popen]:
    """A process standing in for the experiment's supervisor, named as one (the TUI checks
    a supervisor's pid by its command line); nothing here may stop it."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "workbench.supervisor"]
    )
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def experiment(tmp_path: Path, monkeypatch, stand_in_supervisor) -> Path:
    """The TUI tests' synthetic experiment, written as of now (the served TUI reads the real
    clock) with the stand-in as its running supervisor."""
    monkeypatch.setattr(synthetic, "FROZEN_NOW", time.time())
    experiment = synthetic.build_experiment(tmp_path, supervisor_pid=stand_in_supervisor.pid)
    paths.pid_path(experiment).write_text(f"{stand_in_supervisor.pid}\n")
    return experiment


def test_another_address_without_a_token_serves_nothing(experiment: Path):
    port = free_port()
    result = run_web(experiment, "--host", "0.0.0.0", "--port", str(port))
    assert result.returncode == 2
    assert "give a token" in result.stderr and "WORKBENCH_WEB_TOKEN" in result.stderr
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "nothing listens"


def test_a_port_in_use_is_refused_before_serving(experiment: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_web(experiment, "--port", str(port))
    assert result.returncode == 2
    assert f"cannot serve on 127.0.0.1:{port}" in result.stderr and "--port" in result.stderr


class Served:
    """A `workbench web` process, the address it serves and the one it printed, carrying
    the token (`url_with_token`)."""

    def __init__(self, experiment: Path, *args: str, token: str | None = None) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("WORKBENCH_WEB_TOKEN", None)
        if token is not None:
            env["WORKBENCH_WEB_TOKEN"] = token
        self.process = subprocess.Popen(
            web_command(experiment, "--port", str(self.port), *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.url = f"http://127.0.0.1:{self.port}/"
        self.printed = self._read_until_address()
        self.url_with_token = self.printed[-1].removeprefix("open ").split(" ")[0]
        deadline = time.monotonic() + 60
        while not self._listening():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"workbench web did not serve: {self.stop()}")
            time.sleep(0.1)

    def _read_until_address(self) -> list[str]:
        """What it printed up to the line naming the address to open (printed before it
        serves; at its end if it never gets there). Read on a thread: a `select` on the pipe
        misses lines the text reader has already buffered, and waits out its deadline."""
        assert self.process.stdout is not None
        self._output: queue.Queue[str] = queue.Queue()
        self._pump = threading.Thread(target=_pump, args=(self.process.stdout, self._output))
        self._pump.start()
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while not lines or not lines[-1].startswith("open "):
            try:
                line = self._output.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line == "":  # its end, or the deadline
                self.process.kill()
                raise AssertionError(f"workbench web printed no address: {lines}")
            lines.append(line.rstrip("\n"))
        return lines

    def _listening(self) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def tuis(self) -> list[psutil.Process]:
        """The TUI processes it runs for the pages open now."""
        children = psutil.Process(self.process.pid).children(recursive=True)
        # Each runs under a shell (textual-serve runs a shell command): the Python processes.
        return [child for child in children if "workbench.tui" in child.cmdline()]

    def stop(self) -> str:
        """Ctrl-C, then everything it printed; it must stop within 10 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                raise AssertionError("Ctrl-C did not stop workbench web") from None
        self._pump.join(timeout=10)  # it ends with the output
        rest = []
        while not self._output.empty():
            rest.append(self._output.get())
        return "\n".join(self.printed) + "\n" + "".join(rest)


@pytest.fixture
def browser():
    if CHROMIUM is None:
        pytest.fail("chromium is not installed (apt-get install chromium; .ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: the tests run as root, where Chromium's sandbox refuses to start.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1280, "height": 760})
    page.add_init_script(CATCH_TERMINAL)
    # Nothing leaves this machine (the page links a web font); what is not ours is refused.
    ours = url.split("?")[0]
    page.route(
        "**/*",
        lambda route: route.continue_() if route.request.url.startswith(ours) else route.abort(),
    )
    page.goto(url)
    return page


def wait_for_text(page, *wanted: str, timeout: float = 60.0) -> str:
    """What the page's terminal shows once it shows every one of `wanted`."""
    deadline = time.monotonic() + timeout
    shown = ""
    while time.monotonic() < deadline:
        shown = page.evaluate(SCREEN_TEXT)
        if all(text in shown for text in wanted):
            return shown
        page.wait_for_timeout(100)
    raise AssertionError(f"the page never showed {wanted}; it shows:\n{shown}")


def screenshot_dir(tmp_path: Path) -> Path:
    return Path(os.environ.get("DOCS_SCREENSHOTS") or tmp_path)


def test_the_page_shows_the_runs_their_details_and_curves(
    experiment: Path, browser, tmp_path: Path, stand_in_supervisor
):
    served = Served(experiment)
    try:
        page = open_page(browser, served.url_with_token)
        assert page.url == served.url, "the token leaves the address bar"
        wait_for_text(page, "run_lr1e-3", "run_lr3e-4", "run_queued", "run_typo")
        pictures = screenshot_dir(tmp_path)
        page.wait_for_timeout(500)  # the last frame drawn
        page.screenshot(path=pictures / "web-runs.png")

        # Keys go to the terminal's input (a click would land on, and focus, some widget).
        page.focus(".xterm-helper-textarea")
        page.keyboard.press("Enter")
        wait_for_text(page, "control/orch.toml", "reward (mean)", "lr = 1e-3")
        page.wait_for_timeout(500)
        page.screenshot(path=pictures / "web-run-details.png")

        page.keyboard.press("c")
        wait_for_text(page, "curves  reward_mean by step", "2 of 4 runs", "run_typo")
        page.wait_for_timeout(500)
        page.screenshot(path=pictures / "web-curves.png")

        assert len(served.tuis()) == 1, "one TUI for the one page"
        page.close()
        deadline = time.monotonic() + 30
        while served.tuis() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not served.tuis(), "closing the tab ends its TUI"
        assert stand_in_supervisor.poll() is None, "and the experiment runs on"
        assert served.process.poll() is None, "the server serves on for the next tab"
    finally:
        printed = served.stop()
    assert f"http://127.0.0.1:{served.port}/" in printed
    assert f"ssh -N -L {served.port}:127.0.0.1:{served.port}" in printed
    assert printed.count("?token=") == 1, "the address with the token is printed once"


def test_the_page_asks_for_the_token_and_refuses_a_wrong_one(experiment: Path, browser):
    served = Served(experiment, token=TOKEN)
    try:
        page = open_page(browser, served.url)
        assert page.locator("#token").is_visible(), "the page asks for the token"
        page.wait_for_timeout(1000)
        assert not served.tuis(), "no TUI without the token"
        status = page.request.get(served.url.rstrip("/") + "/ws").status
        assert status == 401, "nor its websocket"

        page.fill("#token", "wrong")
        page.click("#sign-in")
        assert "wrong token" in page.content()
        assert not served.tuis()

        page.fill("#token", TOKEN)
        page.click("#sign-in")
        wait_for_text(page, "run_lr1e-3")
        tuis = served.tuis()
        assert len(tuis) == 1
    finally:
        served.stop()
    # Ctrl-C with the tab still open: the server stops at once, and the tab's TUI with it.
    _, left = psutil.wait_procs(tuis, timeout=10)
    assert not left, "no TUI outlives the server"


def get(served: Served, path: str, **headers: str) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    connection.request("GET", path, headers=headers)
    return connection.getresponse()


def signed_in(served: Served) -> str:
    """The session cookie the printed address gives (`Cookie` header's value)."""
    answer = get(served, served.url_with_token.removeprefix(served.url.rstrip("/")))
    assert answer.status == 303 and answer.getheader("Location") == "/"
    return answer.getheader("Set-Cookie").split(";")[0]


def test_loopback_without_the_token_serves_nothing(experiment: Path):
    """Any user of this machine can open 127.0.0.1: without the token or the cookie its
    first visit gives, neither the page nor the TUI's websocket answers."""
    served = Served(experiment)
    try:
        assert served.url_with_token.startswith(served.url + "?token=")
        token = served.url_with_token.split("?token=")[1]
        assert len(token) >= 32, "a token of its own, hard to guess"
        assert get(served, "/").status == 401, "the page asks for the token"
        assert get(served, "/ws").status == 401
        assert get(served, "/?token=" + "x" * len(token)).status == 403
        assert not served.tuis()
        cookie = signed_in(served)
        assert get(served, "/", Cookie=cookie).status == 200
    finally:
        served.stop()


def test_a_token_shorter_than_16_characters_is_refused(experiment: Path):
    port = free_port()
    for given in (["--token", "x" * 15], []):
        try:
            result = subprocess.run(
                web_command(experiment, "--port", str(port), *given),
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ, "PYTHONPATH": str(REPO), "WORKBENCH_WEB_TOKEN": "y" * 15},
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"workbench web served with a 15-character token ({given or 'env'})")
        assert result.returncode == 2, result
        assert "15 characters" in result.stderr and "at least 16" in result.stderr
        assert "--token" in result.stderr and "WORKBENCH_WEB_TOKEN" in result.stderr
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "nothing listens"


def test_other_sites_pages_cannot_reach_a_loopback_page(experiment: Path):
    served = Served(experiment)
    try:
        cookie = signed_in(served)

        def status(path: str, **headers: str) -> int:
            return get(served, path, Cookie=cookie, **headers).status

        assert status("/") == 200
        # A name of another site resolving to 127.0.0.1 (DNS rebinding).
        assert status("/", Host=f"evil.example:{served.port}") == 403
        # A websocket opened by another site's page.
        assert status("/ws", Origin="http://evil.example") == 403
        assert not served.tuis()
    finally:
        served.stop()


def test_a_server_killed_outright_leaves_no_tui_behind(experiment: Path, browser):
    served = Served(experiment)
    tuis: list[psutil.Process] = []
    try:
        page = open_page(browser, served.url_with_token)
        wait_for_text(page, "run_lr1e-3")
        tuis = served.tuis()
        assert len(tuis) == 1
        served.process.kill()  # no Ctrl-C: nothing tells the TUI to quit
        _, left = psutil.wait_procs(tuis, timeout=10)
        assert not left, "the TUI dies with its server"
    finally:
        served.process.kill()
        served.process.wait()
        for tui in tuis:  # none is left unless the test failed
            with contextlib.suppress(psutil.NoSuchProcess):
                tui.kill()


def _pump(stream, lines: queue.Queue) -> None:
    """Every line of `stream` into `lines`, then "" at its end."""
    for line in stream:
        lines.put(line)
    lines.put("")
