"""Sessions and their heartbeats: a session whose heartbeats stop for `timeout_s` is ended,
its models' state saved (a save_state work item each) so that `load_state` finds it; a
session its client closes ends the same way at once."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The SDK beats every 10 s and warns after 120 s without an answer.
DEFAULT_TIMEOUT_S = 120.0


@dataclass
class Session:
    session_id: str
    last_beat: float
    model_ids: list[str] = field(default_factory=list)
    ended: bool = False


class Sessions:
    def __init__(
        self, timeout_s: float = DEFAULT_TIMEOUT_S, clock: Callable[[], float] = time.monotonic
    ):
        self.timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    def create(self) -> Session:
        session = Session(f"session-{secrets.token_hex(6)}", self._clock())
        with self._lock:
            self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        with self._lock:
            return self._sessions.get(session_id)

    def beat(self, session_id: str) -> Session | None:
        """Record a heartbeat; the session (None if unknown), `ended` if it timed out."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and not session.ended:
                session.last_beat = self._clock()
            return session

    def finish(self, session_id: str) -> Session | None:
        """End a session its client closed (`ServiceClient.close`); the session if this call
        ended it, None if it is unknown or had ended already."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session.ended:
                return None
            session.ended = True
            return session

    def expire(self) -> list[Session]:
        """End the sessions whose heartbeats stopped; those just ended."""
        now = self._clock()
        ended = []
        with self._lock:
            for session in self._sessions.values():
                if not session.ended and now - session.last_beat > self.timeout_s:
                    session.ended = True
                    ended.append(session)
        return ended
