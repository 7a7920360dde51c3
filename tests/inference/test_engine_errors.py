"""Reading what killed vLLM's engine from a server log (a real one, from vLLM 0.32.0's CPU
build dying at a split prefill of a seeded request before workbench's rewind)."""

from __future__ import annotations

from pathlib import Path

from workbench.inference.engine_errors import engine_fatal_error

ENGINE_LOG = Path(__file__).parent / "data" / "engine_fatal_error.log"


def test_the_engines_last_exception_is_the_cause(tmp_path: Path):
    assert engine_fatal_error(ENGINE_LOG) == (
        "vLLM's engine died: RuntimeError: CPU Generator does not use offset"
    )


def test_an_earlier_start_of_the_server_is_not_blamed(tmp_path: Path):
    log = tmp_path / "inference.log"
    log.write_bytes(ENGINE_LOG.read_bytes())
    restarted_at = log.stat().st_size
    with open(log, "a") as out:
        out.write("INFO 11-27 03:53:10 [api_server.py:1] Starting vLLM API server\n")
    assert engine_fatal_error(log, start_offset=restarted_at) is None
    assert engine_fatal_error(log) is not None


def test_a_log_without_an_engine_error_names_no_cause(tmp_path: Path):
    log = tmp_path / "inference.log"
    log.write_text('INFO:     127.0.0.1:36680 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
    assert engine_fatal_error(log) is None
    assert engine_fatal_error(tmp_path / "missing.log") is None
