"""A SIGTERM-ed orchestrator exits at once even with generation requests in flight that
the server never answers: what a vLLM stopping at the same time does when the supervisor
dies and both get SIGTERM. The server here is a stand-in that accepts requests and never
replies (a real vLLM cannot be made to hang on purpose)."""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.helpers import make_run
from workbench.files.endpoint import Endpoint, new_api_key, write_endpoint


class Silent(http.server.BaseHTTPRequestHandler):
    chats = threading.Event()

    def do_GET(self):  # /health
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):  # a chat completion: never answered
        Silent.chats.set()
        threading.Event().wait(3600)

    def log_message(self, *args):
        pass


def test_a_stopped_orchestrator_does_not_wait_for_answers_that_never_come(tmp_path: Path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    experiment = tmp_path / "exp"
    run = make_run(experiment, "run_a", "eval = { interval = 0 }\n")
    write_endpoint(
        experiment, Endpoint(f"http://127.0.0.1:{port}/v1", new_api_key(), "builtin:tiny-reverse")
    )
    orchestrator = subprocess.Popen(
        [sys.executable, "-m", "workbench.orchestrator", "--run-dir", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert Silent.chats.wait(120), "the orchestrator sent no generation request"
        orchestrator.send_signal(signal.SIGTERM)
        # It waited for the requests' 600 s timeout before.
        code = orchestrator.wait(timeout=60)
    finally:
        orchestrator.kill()
        server.shutdown()
    assert code == 0, orchestrator.stdout.read()[-2000:]
