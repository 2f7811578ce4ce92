"""A cancel ends a bounded wait even when it lands as the awaited answer arrives.

Python 3.11's ``asyncio.wait_for`` returns the answer then and drops the cancel (CPython
gh-86296): the confirmation run's /metrics watcher, cancelled at the end of a step, went on polling,
and the run waited for it for ever. These waits use ``asyncio.timeout`` (ruff bans wait_for); the
answer here is made to arrive in the same loop turn as the cancel, the moment wait_for loses it.
Only ``fetch`` is replaced: the seam where the answer's timing can be chosen."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from radixtop.incident.confirm import confirm_run
from radixtop.incident.replay import replay
from radixtop.probes import http
from radixtop.probes.http import Fetched

URL = "http://127.0.0.1:9"

WAITS: dict[str, Callable[[httpx.AsyncClient], Awaitable[object]]] = {
    "the confirmation run's /metrics read": lambda client: confirm_run._metrics(client, URL),
    "the replay's /health check": lambda client: replay.server_alive(client, URL),
    "the replay's cache flush": lambda client: replay.flush_cache(client, URL),
}


@pytest.mark.parametrize("what", list(WAITS))
async def test_a_cancel_that_lands_with_the_answer_still_cancels(monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    answer: asyncio.Future[Fetched] = asyncio.get_running_loop().create_future()
    asked = asyncio.Event()

    async def fetch(client: httpx.AsyncClient, url: str, **kwargs: object) -> Fetched:
        asked.set()
        return await answer

    monkeypatch.setattr(http, "fetch", fetch)
    async with httpx.AsyncClient() as client:
        task = asyncio.create_task(WAITS[what](client))
        async with asyncio.timeout(5):
            await asyncio.wait({task, asyncio.create_task(asked.wait())}, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), "it asks, then waits for the answer"
        await asyncio.sleep(0)
        answer.set_result(Fetched(URL, 200, b"", None, 0.0))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(5):
                await task
        assert task.cancelled()
