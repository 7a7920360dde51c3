"""Futures: every accepted request gets a request id at once; `retrieve_future` answers its
result, or Tinker's try-again while it waits (for its turn, for the trainer).

A held `retrieve_future` waits on an event; one poller task looks at every waited-for
request each `check_s` and sets the events of those answered. Each held request looking
for itself every 10 ms was 1,600 wake-ups a second with 8 clients, each holding about two:
the service then spent as much CPU as the trainer (`workbench bench tinker`, 2-core CPU).
"""

from __future__ import annotations

import asyncio
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
    def __init__(self, check_s: float = 0.01) -> None:
        self.check_s = check_s
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._resolvers: dict[str, Resolver] = {}
        self._answers: dict[str, Answer] = {}
        # Held retrieves (on the event loop): an event per request, and how many wait on it
        # (a client's retry may hold the same id twice).
        self._events: dict[str, asyncio.Event] = {}
        self._holders: dict[str, int] = {}
        self._poller: asyncio.Task | None = None

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

    async def wait(self, request_id: str, timeout_s: float) -> Answer | None:
        """The answer of a known request once there is one, or None after `timeout_s`."""
        answer = self.answer(request_id)
        if answer is not None:
            return answer
        event = self._events.setdefault(request_id, asyncio.Event())
        self._holders[request_id] = self._holders.get(request_id, 0) + 1
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="tinker futures poller")
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return None
        finally:
            self._holders[request_id] -= 1
            if not self._holders[request_id]:
                del self._holders[request_id], self._events[request_id]
        return self.answer(request_id)

    async def _poll(self) -> None:
        """While a retrieve is held: each `check_s`, resolve every held request once."""
        while self._events:
            await asyncio.sleep(self.check_s)
            for request_id, event in list(self._events.items()):
                if not event.is_set() and self.answer(request_id) is not None:
                    event.set()

    def _new_id(self) -> str:
        return f"req-{next(self._counter)}"


def try_again(request_id: str) -> dict:
    """Tinker's TryAgainResponse: the SDK polls again."""
    return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
