"""The service's futures (`tinker/futures.py`): a held retrieve gets its answer once there
is one, from one poller however many are held; try-again (None) after its time."""

from __future__ import annotations

import asyncio

from workbench.tinker.futures import Answer, FutureStore


class Later:
    """A resolver that answers on its `after`-th call; counts its calls."""

    def __init__(self, after: int) -> None:
        self.after, self.calls = after, 0

    def __call__(self) -> Answer | None:
        self.calls += 1
        return Answer(body={"n": self.calls}) if self.calls >= self.after else None


def test_held_retrieves_get_their_answers_from_one_poller():
    async def scenario():
        store = FutureStore(check_s=0.01)
        resolvers = [Later(after) for after in (3, 5, 8)]
        ids = [store.pending(resolver) for resolver in resolvers]
        twice = ids[2]  # a retry holding the same id as a first try
        answers = await asyncio.gather(
            *(store.wait(request_id, 5.0) for request_id in ids), store.wait(twice, 5.0)
        )
        assert [a.body for a in answers] == [{"n": 3}, {"n": 5}, {"n": 8}, {"n": 8}]
        # Each resolver was asked once a poll until it answered, never after: one poller.
        assert [r.calls for r in resolvers] == [3, 5, 8]
        assert store._events == {} and store._holders == {}
        await asyncio.sleep(0.05)
        assert store._poller is not None and store._poller.done(), "the poller idles out"
        assert (await store.wait(ids[0], 0.1)).body == {"n": 3}, "answers are kept"

    asyncio.run(scenario())


def test_a_request_not_answered_in_time_is_none_and_can_be_held_again():
    async def scenario():
        store = FutureStore(check_s=0.01)
        resolver = Later(after=10**9)
        request_id = store.pending(resolver)
        assert await store.wait(request_id, 0.1) is None
        assert store._events == {}
        resolver.after = resolver.calls + 2
        assert (await store.wait(request_id, 5.0)).body == {"n": resolver.after}

    asyncio.run(scenario())
