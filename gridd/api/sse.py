"""``GET /events``: the durable event log as Server-Sent Events.

Resume rules: ``Last-Event-ID`` (or ``?since=N``) replays every event after N from the log,
then switches to live delivery with no gap and no duplicate. A stream the bus takes off live
delivery to stay within ``events.total_bytes`` (a slow reader, see ``gridd.events``) goes
back to reading the log the same way, on the same connection. A resume point older than the
log retains (or from another database) gets ``reset`` then ``state.snapshot``. A fresh
stream opens with a snapshot, so a client never has to race ``GET /state`` against events.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from gridd.api.errors import query_int
from gridd.errors import BadRequest
from gridd.event_types import RESET, SNAPSHOT, refuse_unknown
from gridd.events import BATCH_BYTES, Subscriber
from gridd.grid import Grid
from gridd.model import Event

if TYPE_CHECKING:
    from sse_starlette import EventSourceResponse, ServerSentEvent

_TYPE_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789._-")
MAX_TYPES = 64

log = logging.getLogger(__name__)


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), default=str)


def encoded(event: Event) -> bytes:
    """The event as SSE bytes, encoded once and shared by every stream that sends it."""
    cached = event._sse
    if cached is None:
        data = event._json or _dumps(event.data)
        # CRLF, as sse-starlette writes its own events (snapshots, pings).
        cached = f"id: {event.id}\r\nevent: {event.type}\r\ndata: {data}\r\n\r\n".encode()
        event._sse = cached
        event._json = None  # the encoded form replaces it: one copy of a 64 KiB chunk, not two
    return cached


def parse_since(request: Request) -> int | None:
    header = request.headers.get("last-event-id")
    if header is not None and header.strip() != "":
        try:
            value = int(header.strip())
        except ValueError:
            raise BadRequest(
                f"Last-Event-ID must be an integer event id, got {header!r}",
                code="bad_last_event_id",
            ) from None
        if value < 0:
            raise BadRequest("Last-Event-ID must be >= 0", code="bad_last_event_id")
        return value
    return query_int(request, "since")


def parse_types(request: Request) -> frozenset[str] | None:
    raw = request.query_params.get("types")
    if not raw:
        return None
    types = frozenset(t.strip() for t in raw.split(",") if t.strip())
    if len(types) > MAX_TYPES:
        raise BadRequest(
            f"at most {MAX_TYPES} event types in 'types', got {len(types)}", code="bad_query"
        )
    for name in types:
        if len(name) > 64 or not set(name) <= _TYPE_CHARS:
            raise BadRequest(f"invalid event type in 'types': {name!r}", code="bad_query")
    # A misspelt type would match nothing, forever: indistinguishable from "no events yet".
    refuse_unknown(types)
    return types or None


class EventStream:
    """One client's stream: replay, then live, with periodic snapshots."""

    def __init__(self, grid: Grid, *, since: int | None, types: frozenset[str] | None) -> None:
        self.grid = grid
        self.since = since
        self.types = types
        self.last = since if since is not None else grid.bus.last_id
        self.sub: Subscriber | None = None

    def _snapshot(self) -> ServerSentEvent:
        return sse_library().event(
            data=self.grid.state_json().decode(), event=SNAPSHOT, id=str(self.last)
        )

    def _wants_snapshots(self) -> bool:
        return self.types is None or SNAPSHOT in self.types

    async def __aiter__(self) -> AsyncIterator[ServerSentEvent | bytes]:
        bus = self.grid.bus
        try:
            if self.since is None:
                # The position is taken when subscribing, not when the request arrived:
                # anything published in between is in the snapshot, and its id says so.
                self.sub = bus.subscribe(types=self.types)
                self.last = bus.last_id
                if self._wants_snapshots():
                    yield self._snapshot()
            else:
                oldest, latest = bus.oldest_id(), bus.last_id
                if self.since > latest or self.since < oldest - 1:
                    self.sub = bus.subscribe(types=self.types)
                    self.last = latest
                    yield sse_library().event(
                        data=_dumps(
                            {"requested": self.since, "oldestRetained": oldest, "latest": latest}
                        ),
                        event=RESET,
                        id=str(latest),
                    )
                    yield self._snapshot()
                else:
                    async for chunk in self._replay():
                        yield chunk
            while True:
                async for item in self._live():
                    yield item
                if self.sub is None or not self.sub.lagging:
                    return
                # Too far behind to be queued for: the log serves it until it catches up.
                bus.unsubscribe(self.sub)
                self.sub = None
                async for chunk in self._replay():
                    yield chunk
        finally:
            if self.sub is not None:
                bus.unsubscribe(self.sub)

    async def _replay(self) -> AsyncIterator[bytes]:
        """Every logged event after ``self.last``, in pages, then subscribe. Subscribing
        right after the final (empty) read, with no await in between, is what makes the
        hand-over gap-free."""
        bus = self.grid.bus
        while True:
            page = bus.replay(self.last, types=self.types)
            if not page:
                self.sub = bus.subscribe(types=self.types)
                return
            self.last = page[-1].id
            for part in _sends(page):
                yield part

    async def _live(self) -> AsyncIterator[ServerSentEvent | bytes]:
        assert self.sub is not None
        interval = self.grid.settings.events.snapshot_seconds
        next_snapshot = time.monotonic() + interval
        while True:
            if time.monotonic() >= next_snapshot:  # due even on a stream that is never idle
                if self._wants_snapshots():
                    yield self._snapshot()
                next_snapshot = time.monotonic() + interval
            timeout = max(0.0, next_snapshot - time.monotonic())
            batch = await self.sub.get_batch(timeout=timeout)
            if batch is None:
                return
            if not batch:
                continue
            fresh = [e for e in batch if e.id > self.last]
            if fresh:
                self.last = fresh[-1].id
                # One send for the whole burst; each event was encoded once, at publish.
                yield b"".join(encoded(e) for e in fresh)


def _sends(events: list[Event]) -> list[bytes]:
    """Events joined into sends of about ``BATCH_BYTES`` each (one buffer per send, so a
    page of 64 KiB output chunks is not copied whole for every stream replaying it)."""
    sends: list[bytes] = []
    part: list[bytes] = []
    size = 0
    for event in events:
        data = encoded(event)
        part.append(data)
        size += len(data)
        if size >= BATCH_BYTES:
            sends.append(b"".join(part))
            part, size = [], 0
    if part:
        sends.append(b"".join(part))
    return sends


#: Where the ASGI server's own ``send`` waits in the scope (``gridd.api.app.GriddApp``).
RAW_SEND = "gridd.raw_send"


def direct_after_start(scope: Scope, send: Send) -> Send:
    """``send``, but once the response has started, straight to the server's own ``send``.

    Every message otherwise passes through each middleware's wrapper (errors, the request
    timer, exception handling: four coroutine layers) on every batch of every stream. They
    only look at ``http.response.start``, which still goes through them all."""
    raw: Send | None = scope.get(RAW_SEND)
    if raw is None:
        return send
    started = False

    async def send_direct(message: Message) -> None:
        nonlocal started
        if started:
            await raw(message)
            return
        await send(message)
        started = message["type"] == "http.response.start"

    return send_direct


class _Library:
    """sse-starlette's event and response classes, imported on the first stream: a daemon
    nobody watches never loads them."""

    def __init__(self) -> None:
        from sse_starlette import EventSourceResponse, ServerSentEvent
        from sse_starlette.sse import SendTimeoutError

        class _EventSourceResponse(EventSourceResponse):
            """sse-starlette's response; a client too slow to take one send is dropped
            quietly. It resumes with Last-Event-ID and loses nothing, so this is a warning,
            not a traceback. (The protocol's stall guard usually aborts such a connection
            first; see api.protocol.)"""

            async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
                try:
                    await super().__call__(scope, receive, direct_after_start(scope, send))
                except SendTimeoutError:
                    log.warning(
                        "SSE client took longer than %ss to accept data; dropped",
                        self.send_timeout,
                    )

            async def _send_with_timeout(self, send: Send, message: Message) -> None:
                """As sse-starlette's, with asyncio's timeout: its anyio cancel scope
                cost more than the rest of a send (one per batch per stream)."""
                if self.send_timeout is None:
                    await send(message)
                    return
                try:
                    async with asyncio.timeout(self.send_timeout):
                        await send(message)
                except TimeoutError:
                    raise SendTimeoutError() from None

        self.event = ServerSentEvent
        self.response = _EventSourceResponse


@functools.cache
def sse_library() -> _Library:
    return _Library()


async def events_endpoint(request: Request) -> EventSourceResponse:
    grid: Grid = request.app.state.grid
    stream = EventStream(grid, since=parse_since(request), types=parse_types(request))
    settings = grid.settings.events
    return sse_library().response(
        stream.__aiter__(),
        ping=settings.keepalive_seconds,
        # A backstop: the protocol aborts a peer stalled for send_timeout_seconds first.
        send_timeout=settings.send_timeout_seconds * 2,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
