"""How an event stream's bytes reach the socket: events queued together go out as one body
message, in order; once the response has started, body messages go straight to the
server's ``send`` (``direct_after_start``), while the start still passes every middleware
(the request timer still counts the stream)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from gridd.api import sse
from gridd.client import SSEEvent, SSEParser
from gridd.grid import Grid
from tests.support.daemons import inprocess_daemon


async def test_a_started_stream_sends_straight_to_the_server_not_through_the_wrappers() -> None:
    wrapped: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []

    async def through_middlewares(message: Any) -> None:
        wrapped.append(message)

    async def server_send(message: Any) -> None:
        raw.append(message)

    send = sse.direct_after_start({sse.RAW_SEND: server_send}, through_middlewares)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"a", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    assert [m["type"] for m in wrapped] == ["http.response.start"]
    assert [m["body"] for m in raw] == [b"a", b""]
    # Without the server's send in the scope (another app), everything goes the usual way.
    assert sse.direct_after_start({}, through_middlewares) is through_middlewares


async def test_events_published_together_reach_a_client_in_order_in_few_sends(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies: list[bytes] = []
    original = sse.direct_after_start

    def counting(scope: Any, send: Any) -> Any:
        inner = original(scope, send)

        async def counted(message: Any) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                bodies.append(message["body"])
            await inner(message)

        return counted

    monkeypatch.setattr(sse, "direct_after_start", counting)
    async with inprocess_daemon(repo) as d:
        grid = cast(Grid, d.grid)
        transport = httpx.AsyncHTTPTransport(uds=str(d.sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://gridd") as http:
            got: list[SSEEvent] = []

            async def follow() -> None:
                timeout = httpx.Timeout(10, read=None)
                async with http.stream("GET", "/events", timeout=timeout) as r:
                    parser = SSEParser()
                    async for line in r.aiter_lines():
                        if (event := parser.feed_line(line)) is not None:
                            got.append(event)

            follower = asyncio.create_task(follow())
            try:
                deadline = time.monotonic() + 15
                while not got:  # the opening snapshot: the stream is live
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
                sends_before = len(bodies)
                first = grid.bus.last_id + 1
                for n in range(200):  # no await in between: all queued at once
                    grid.bus.publish("test.burst", {"n": n})
                while got[-1].id != grid.bus.last_id:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
            finally:
                follower.cancel()
            burst = [e for e in got if e.type == "test.burst"]
            assert [e.id for e in burst] == list(range(first, first + 200))
            assert [int(e.data["n"]) for e in burst] == list(range(200))
            assert len(bodies) - sends_before <= 5  # one per batch, not one per event
            # The start still passed the request timer: the stream is counted with its status.
            while ("GET", "/events", 200) not in grid.metrics.requests.codes:
                assert time.monotonic() < deadline + 10
                await asyncio.sleep(0.01)
