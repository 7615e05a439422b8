"""Hardening case 12: the events buffered for all SSE clients together are bounded
(``events.total_bytes``). Past it, the client furthest behind is taken off live delivery:
a stalled one is dropped (it reconnects with Last-Event-ID), a slow one that still reads
(64 KiB/s) keeps its connection and gets every event from the log. Nobody loses anything.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import cast

import httpx

from gridd.client import SSEEvent, SSEParser
from gridd.events import EventBus
from gridd.grid import Grid
from gridd.store import Store
from tests.support.daemons import inprocess_daemon

CHUNK = 64 * 1024
LIMIT = 256 * 1024


def queued_bytes(bus: EventBus) -> int:
    """What every live subscriber queue holds, each event counted once (it is one object)."""
    held: dict[int, int] = {}
    for sub in list(bus._subscribers):
        for item in list(sub.queue._queue):  # type: ignore[attr-defined]
            if item is not None:
                held[item.id] = item._nbytes
    return sum(held.values())


class SlowReader(threading.Thread):
    """One ``GET /events`` read at ``rate`` bytes per second, on one connection."""

    def __init__(self, sock: Path, rate: float) -> None:
        super().__init__(daemon=True)
        self.sock, self.rate = sock, rate
        self.events: list[SSEEvent] = []
        self.target: int | None = None
        self.connections = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        transport = httpx.HTTPTransport(uds=str(self.sock))
        try:
            with (
                httpx.Client(transport=transport, base_url="http://gridd") as http,
                http.stream("GET", "/events", timeout=httpx.Timeout(10, read=60)) as r,
            ):
                self.connections += 1
                parser, got, t0 = SSEParser(), 0, time.monotonic()
                for line in r.iter_lines():
                    got += len(line) + 2
                    if (event := parser.feed_line(line)) is not None:
                        self.events.append(event)
                        if self.target is not None and int(event.id or 0) >= self.target:
                            return
                    ahead = t0 + got / self.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
        except BaseException as exc:
            self.error = exc


def _recv_or_reset(sock: socket.socket) -> bytes:
    try:
        return sock.recv(1 << 20)
    except ConnectionResetError:
        return b""


async def test_event_memory_is_capped_for_all_clients_and_a_64kib_reader_loses_nothing(
    repo: Path,
) -> None:
    # A Unix socket takes more only once 3/4 of its send buffer (~200 KiB) drained: at
    # 64 KiB/s a slow reader's progress shows every ~2.5 s, so the window is wider.
    config = {"events": {"total_bytes": LIMIT, "send_timeout_seconds": 8.0}}
    async with inprocess_daemon(repo, config) as d:
        grid = cast(Grid, d.grid)
        loop = asyncio.get_running_loop()
        # A client that never reads.
        frozen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        frozen.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        frozen.setblocking(False)
        await loop.sock_connect(frozen, str(d.sock))
        await loop.sock_sendall(frozen, b"GET /events HTTP/1.1\r\nHost: gridd\r\n\r\n")
        slow = SlowReader(d.sock, rate=64 * 1024)
        slow.start()
        fast: list[list[SSEEvent]] = [[], []]
        transport = httpx.AsyncHTTPTransport(uds=str(d.sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://gridd") as http:

            async def follow(into: list[SSEEvent]) -> None:
                async with http.stream("GET", "/events", timeout=httpx.Timeout(10, read=None)) as r:
                    parser = SSEParser()
                    async for line in r.aiter_lines():
                        if (event := parser.feed_line(line)) is not None:
                            into.append(event)

            followers = [asyncio.create_task(follow(into)) for into in fast]
            try:
                deadline = time.monotonic() + 15
                while grid.bus.subscriber_count < 4 or not all(fast):
                    assert time.monotonic() < deadline, "clients did not connect"
                    await asyncio.sleep(0.01)
                first = grid.bus.last_id + 1
                peak = 0
                for n in range(24):  # 1.5 MiB of agent output, six times the budget
                    grid.bus.publish(
                        "agent.output", {"agentId": "a-1", "chunk": "x" * CHUNK, "seq": n}
                    )
                    peak = max(peak, queued_bytes(grid.bus))
                    last = grid.bus.last_id
                    # The fast readers keep up; the frozen and the slow one cannot.
                    while any(not f or int(f[-1].id or 0) < last for f in fast):
                        await asyncio.sleep(0.002)
                last = grid.bus.last_id
                assert peak <= LIMIT + CHUNK + 1024, f"{peak} bytes queued, over the cap"
                for got in fast:
                    ids = [int(e.id or 0) for e in got if e.type == "agent.output"]
                    assert ids == list(range(first, last + 1))
                # The slow reader was never cut: one connection, every chunk, in order.
                slow.target = last
                await loop.run_in_executor(None, slow.join, 60)
                assert not slow.is_alive(), "the slow reader never got the last event"
                assert slow.error is None, repr(slow.error)
                assert slow.connections == 1
                ids = [int(e.id or 0) for e in slow.events if e.type == "agent.output"]
                assert ids == list(range(first, last + 1))
                assert grid.bus.lagged_total + grid.bus.dropped_total >= 2
                # The frozen one's connection is closed by the daemon, its buffers freed.
                frozen.setblocking(True)
                frozen.settimeout(20)
                received, t0 = 0, time.monotonic()
                while chunk := await loop.run_in_executor(None, _recv_or_reset, frozen):
                    received += len(chunk)
                    assert time.monotonic() - t0 < 20
                assert received < 24 * CHUNK
                assert queued_bytes(grid.bus) <= LIMIT
            finally:
                for task in followers:
                    task.cancel()
                frozen.close()


async def test_over_the_cap_a_stalled_subscriber_is_dropped_and_a_reading_one_lags(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "gridd.db")
    bus = EventBus(store, queue_size=10_000, total_bytes=LIMIT, stall_seconds=0.2)
    stalled = bus.subscribe()
    reading = bus.subscribe()
    chunk = "x" * CHUNK
    bus.publish("agent.output", {"chunk": chunk, "seq": 0})
    stalled.progress_at -= 1.0  # it has taken nothing for a second
    taken = await reading.get_batch(timeout=0)
    assert taken  # reading, however slowly
    for n in range(1, 8):
        bus.publish("agent.output", {"chunk": chunk, "seq": n})
        assert bus.budget.held <= LIMIT
    assert stalled.dropped and not stalled.lagging
    assert reading.lagging and not reading.dropped
    assert await reading.get_batch(timeout=0) is None  # its stream goes on from the log
    assert bus.subscriber_count == 0
    assert bus.budget.held == 0
    store.close()


async def test_a_burst_is_handed_to_a_stream_in_sends_of_about_256_kib(tmp_path: Path) -> None:
    """Each stream joins a batch into one buffer per send: a 20 MiB burst taken whole by
    fifty streams was a gigabyte of copies. A batch stops growing past ~256 KiB."""
    from gridd.api.sse import _sends
    from gridd.events import BATCH_BYTES

    store = Store.open(tmp_path / "gridd.db")
    bus = EventBus(store, queue_size=10_000, queue_bytes=64 << 20, total_bytes=64 << 20)
    sub = bus.subscribe()
    for n in range(40):  # 2.5 MiB published without a pause
        bus.publish("agent.output", {"chunk": "x" * CHUNK, "seq": n})
    seen: list[int] = []
    while batch := await sub.get_batch(timeout=0):
        assert sum(e._nbytes for e in batch) <= BATCH_BYTES + CHUNK + 1024
        seen += [e.id for e in batch]
    assert seen == list(range(1, 41))
    page = bus.replay(0, limit=100)
    assert all(len(part) <= BATCH_BYTES + 2 * CHUNK for part in _sends(page))
    store.close()
