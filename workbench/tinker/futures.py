"""Futures: every accepted request gets a request id at once; `retrieve_future` answers its
result, or Tinker's try-again while it waits (for its turn, for the trainer)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """A finished request: JSON (`body`) or protobuf bytes (`proto`), or a failure."""

    body: dict | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "user"


# Called at each retrieve: the answer, or None while the request is pending.
Resolver = Callable[[], Answer | None]


class FutureStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._resolvers: dict[str, Resolver] = {}
        self._answers: dict[str, Answer] = {}

    def done(self, answer: Answer) -> str:
        """A request answered already (create_model, get_info's kin)."""
        request_id = self._new_id()
        with self._lock:
            self._answers[request_id] = answer
        return request_id

    def pending(self, resolver: Resolver) -> str:
        request_id = self._new_id()
        with self._lock:
            self._resolvers[request_id] = resolver
        return request_id

    def known(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._answers or request_id in self._resolvers

    def answer(self, request_id: str) -> Answer | None:
        """The answer of a known request, or None while it is pending; KeyError if unknown."""
        with self._lock:
            if request_id in self._answers:
                return self._answers[request_id]
            resolver = self._resolvers[request_id]
        answer = resolver()
        if answer is not None:
            with self._lock:
                self._answers[request_id] = answer
                self._resolvers.pop(request_id, None)
        return answer

    def _new_id(self) -> str:
        return f"req-{next(self._counter)}"


def try_again(request_id: str) -> dict:
    """Tinker's TryAgainResponse: the SDK polls again."""
    return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
