"""The event bus: every state change is appended to the durable log, then fanned out.

``publish`` is synchronous and never waits on the disk: the event gets its id at once
(strictly increasing, in the order subscribers receive them, never reused), and is
committed to SQLite before any subscriber sees it (inside a transaction, fan-out waits for
the commit and a rollback cancels it; while the database is locked or slow the store
queues the write, ``Store.after_commit``, and the fan-out follows its commit, in order).
Each subscriber owns a bounded queue; one that falls behind is dropped (it resumes from its last id with Last-Event-ID and loses
nothing) so a slow client can never slow the others or grow memory without bound.

All queues together are bounded too (``total_bytes``): an event shared by fifty queues is
counted once, while any queue holds it. Past the bound the subscriber furthest behind is
taken off live delivery: one that took nothing for ``stall_seconds`` is dropped (its stream
ends; the client reconnects with Last-Event-ID), one that is reading, however slowly, is
marked ``lagging`` and its stream goes on from the log, holding no queue meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from gridd.model import Event
from gridd.store import Store

log = logging.getLogger(__name__)


DEFAULT_MAX_BYTES = 32 * 1024 * 1024
DEFAULT_TOTAL_BYTES = 64 * 1024 * 1024
DEFAULT_STALL_SECONDS = 10.0
#: A batch handed to a stream stops growing past this: one send joins it into one buffer.
BATCH_BYTES = 256 * 1024
REPLAY_PAGE = 100
#: Bytes of one batch's events handed to subscribers and listeners per turn of the event
#: loop (at least one event); the rest wait for the next turns, in order.
FAN_OUT_BYTES_PER_TURN = 256 * 1024


class Budget:
    """The bytes of distinct events held by any subscriber queue, against ``limit``."""

    __slots__ = ("freed", "held", "limit", "peak", "pending")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        #: Bytes of events published but not yet delivered to any queue: waiting for the
        #: store's writer to commit them, or for their turn to be fanned out. A publisher
        #: that paces itself on ``held`` alone would see nothing of a burst until it lands
        #: in the queues all at once (``pool.pacing`` counts both).
        self.pending = 0
        #: Bytes of events every holder has let go of, ever: grows as readers take events,
        #: whatever is published meanwhile (``pool.pacing`` judges readers' progress by it).
        self.freed = 0

    def hold(self, event: Event) -> None:
        if event._holders == 0:
            self.held += _size(event)
            self.peak = max(self.peak, self.held)
        event._holders += 1

    def release(self, event: Event) -> None:
        event._holders -= 1
        if event._holders == 0:
            self.held -= _size(event)
            self.freed += _size(event)

    @property
    def over(self) -> bool:
        return self.held > self.limit


def _size(event: Event) -> int:
    """Roughly what a queued event holds, by its encoded payload."""
    return event._nbytes


class Subscriber:
    """One live consumer of the bus (an SSE stream, a test, the CLI's follower)."""

    def __init__(
        self,
        *,
        types: frozenset[str] | None,
        maxsize: int,
        after: int,
        max_bytes: int = DEFAULT_MAX_BYTES,
        budget: Budget | None = None,
    ) -> None:
        self.types = types
        self.after = after  # events with id <= after were already replayed from the log
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize)
        self.dropped = False
        self.closed = False
        # Bounded in bytes as well as in events: 4,096 queued 64 KiB output chunks would
        # otherwise hold a quarter of a gigabyte for one slow client.
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self._budget = budget if budget is not None else Budget(DEFAULT_TOTAL_BYTES)
        #: Taken off live delivery to keep the bus under its budget while still reading:
        #: its stream continues from the log (see ``EventBus._shed``).
        self.lagging = False
        #: When it last took something from its queue (monotonic): progress, however slow.
        self.progress_at = time.monotonic()

    def wants(self, event: Event) -> bool:
        return self.types is None or event.type in self.types

    def _offer(self, event: Event) -> bool:
        size = _size(event)
        if self.queued_bytes + size > self.max_bytes and not self.queue.empty():
            self.dropped = True
            return False
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped = True
            return False
        self.queued_bytes += size
        self._budget.hold(event)
        return True

    def _taken(self, item: Event | None) -> Event | None:
        if item is not None:
            self.queued_bytes -= _size(item)
            self._budget.release(item)
            self.progress_at = time.monotonic()
        return item

    def _release(self) -> None:
        """Empty the queue (dropped or lagging): its events are the log's to serve now."""
        while True:
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if item is not None:
                self.queued_bytes -= _size(item)
                self._budget.release(item)

    def stalled(self, now: float, stall_seconds: float) -> bool:
        """Has waiting events yet took none of them for ``stall_seconds``."""
        return not self.queue.empty() and now - self.progress_at >= stall_seconds

    def _close_waiter(self) -> None:
        """Wake a reader blocked on the (now empty) queue, so it sees it must stop."""
        try:
            self.queue.put_nowait(None)
        except asyncio.QueueFull:
            pass

    def _close(self) -> None:
        self.closed = True
        try:
            self.queue.put_nowait(None)
        except asyncio.QueueFull:
            pass  # a full queue has a reader on its way; it stops when the queue is empty

    async def get(self, timeout: float | None = None) -> Event | None:
        """The next event, or None when the stream must end (closed, dropped or timeout).

        A closed subscriber still hands out what was queued before the close (the last
        of it is ``daemon.stopping``); a dropped one ends at once, it resumes from the log.
        """
        if self.dropped or self.lagging:
            return None
        if self.closed:
            try:
                return self._taken(self.queue.get_nowait())
            except asyncio.QueueEmpty:
                return None
        try:
            async with asyncio.timeout(timeout):
                item = self._taken(await self.queue.get())
        except TimeoutError:
            return None
        if item is None or self.dropped:
            return None
        return item

    async def get_batch(
        self, timeout: float | None = None, limit: int = 512, max_bytes: int = BATCH_BYTES
    ) -> list[Event] | None:
        """Everything queued (up to ``limit`` events and about ``max_bytes``), waiting up
        to ``timeout`` only when nothing is.

        ``[]`` means the timeout passed; ``None`` means the stream must end (or, when
        ``lagging``, go on from the log). One wake-up serves a whole burst, which is what
        lets twenty streams keep up with a fast bus.
        """
        if self.dropped or self.lagging:
            return None
        batch: list[Event] = []
        size = 0
        queue = self.queue
        if queue.empty() and not self.closed:
            try:
                # ``timeout()``, not ``wait_for``: on Python 3.11 that makes a task per call,
                # and a stream waits here once per batch it sends.
                async with asyncio.timeout(timeout):
                    first = self._taken(await queue.get())
            except TimeoutError:
                return []
            if first is None or self.dropped or self.lagging:
                return None
            batch.append(first)
            size = _size(first)
        while len(batch) < limit and size < max_bytes:
            try:
                item = self._taken(queue.get_nowait())
            except asyncio.QueueEmpty:
                break
            if item is None:
                self.closed = True
                break
            batch.append(item)
            size += _size(item)
        if not batch and self.closed:
            return None
        return batch

    @property
    def ended(self) -> bool:
        return self.dropped or self.closed or self.lagging


class EventBus:
    """Append-then-publish. Also wakes internal listeners (the scheduler) on every event."""

    def __init__(
        self,
        store: Store,
        *,
        queue_size: int,
        queue_bytes: int = DEFAULT_MAX_BYTES,
        total_bytes: int = DEFAULT_TOTAL_BYTES,
        stall_seconds: float = DEFAULT_STALL_SECONDS,
    ) -> None:
        self._store = store
        self._queue_size = queue_size
        self._queue_bytes = queue_bytes
        self.budget = Budget(total_bytes)
        self._stall_seconds = stall_seconds
        #: Subscribers taken off live delivery by the budget while still reading.
        self.lagged_total = 0
        self._subscribers: set[Subscriber] = set()
        self._listeners: list[Callable[[Event], None]] = []
        #: Committed events waiting for their turn to be fanned out (``_later``), in order.
        self._waiting: deque[Event] = deque()
        self._closed = False
        self.last_id = store.last_event_id()
        self.dropped_total = 0

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    @property
    def closed(self) -> bool:
        return self._closed

    def publish(self, type_: str, data: dict[str, Any] | None = None) -> Event:
        """Append ``type_`` to the log; subscribers and listeners hear of it once it is
        committed (at once outside a transaction, at its commit inside one, never when it
        rolls back; later when the store has queued it). A full disk raises ``StoreError``
        and nobody hears anything."""
        event = self._store.append_event(type_, data or {})
        self.budget.pending += event._nbytes
        self._store.after_commit(lambda: self._fan_out(event))
        return event

    def publish_many(
        self, type_: str, datas: list[dict[str, Any]], *, payloads: list[str] | None = None
    ) -> list[Event]:
        """``publish`` for many events of one type at once (one insert statement, one
        fan-out callback), in order. The output pass publishes agents' chunks this way."""
        if not datas:
            return []
        events = self._store.append_events(type_, datas, payloads=payloads)
        self.budget.pending += sum(event._nbytes for event in events)

        def fan_out() -> None:
            size = 0
            for n, event in enumerate(events):
                if size >= FAN_OUT_BYTES_PER_TURN:
                    self._later(events[n:])
                    return
                size += event._nbytes
                self._fan_out(event)

        self._store.after_commit(fan_out)
        return events

    def _fan_out(self, event: Event) -> None:
        """Deliver ``event``, after the events still waiting their turn (in order)."""
        if self._waiting:
            self._waiting.append(event)
        else:
            self._deliver(event)

    def _later(self, events: list[Event]) -> None:
        """Deliver ``events`` about ``FAN_OUT_BYTES_PER_TURN`` per turn of the loop: a
        50,000-task batch is 200 events of 250 tasks, each handed to every listener, and
        the loop answers others in between. Anything published meanwhile waits behind
        them. (Outside a running loop: at once.)"""
        first = not self._waiting
        self._waiting.extend(events)
        if not first:
            return
        try:
            asyncio.get_running_loop().call_soon(self._next_turn)
        except RuntimeError:
            self._next_turn(all_of_it=True)

    def _next_turn(self, *, all_of_it: bool = False) -> None:
        waiting = self._waiting
        size = 0
        while waiting and (all_of_it or size < FAN_OUT_BYTES_PER_TURN):
            event = waiting.popleft()
            size += event._nbytes
            self._deliver(event)
        if waiting:
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _deliver(self, event: Event) -> None:
        self.last_id = event.id
        self.budget.pending -= event._nbytes
        for sub in list(self._subscribers):
            if sub.wants(event) and not sub._offer(event):
                self._subscribers.discard(sub)
                sub._release()
                self.dropped_total += 1
                log.warning("event subscriber fell behind at event %d; disconnecting it", event.id)
        if self.budget.over:
            self._shed()
        for listener in self._listeners:
            listener(event)

    def _shed(self) -> None:
        """Take the subscribers furthest behind off live delivery until the queues hold no
        more than the budget: drop the stalled, let the slow go on from the log."""
        now = time.monotonic()
        behind = sorted(self._subscribers, key=lambda s: s.queued_bytes, reverse=True)
        for sub in behind:
            if not self.budget.over or sub.queued_bytes == 0:
                return
            self._subscribers.discard(sub)
            if sub.stalled(now, self._stall_seconds):
                sub.dropped = True
                self.dropped_total += 1
                log.warning(
                    "event subscriber took nothing for %.0fs and %d bytes of events were"
                    " waiting for it (over events.total_bytes); disconnecting it",
                    now - sub.progress_at,
                    sub.queued_bytes,
                )
            else:
                sub.lagging = True
                self.lagged_total += 1
                log.info(
                    "event subscriber %d bytes behind (over events.total_bytes): it goes on"
                    " from the log",
                    sub.queued_bytes,
                )
            sub._release()
            sub._close_waiter()

    def subscribe(
        self, *, types: Iterable[str] | None = None, after: int | None = None
    ) -> Subscriber:
        """Register a live subscriber that receives every event with id > ``after``.

        Must be called with no ``await`` between the caller's last read of the log and this
        call, so that nothing is published in between (no gap, no duplicate).
        """
        sub = Subscriber(
            types=frozenset(types) if types else None,
            maxsize=self._queue_size,
            max_bytes=self._queue_bytes,
            after=self.last_id if after is None else after,
            budget=self.budget,
        )
        if self._closed:
            sub._close()
        else:
            self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        if sub in self._subscribers:
            self._subscribers.discard(sub)
            sub._release()

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def close(self) -> None:
        """End every live stream (daemon shutdown), after the events still waiting."""
        self._next_turn(all_of_it=True)
        self._closed = True
        for sub in list(self._subscribers):
            sub._close()
        self._subscribers.clear()

    def replay(
        self, since: int, *, types: Iterable[str] | None = None, limit: int = REPLAY_PAGE
    ) -> list[Event]:
        """A page of the log after ``since``. Pages are small because an event may be a
        64 KiB output chunk: a page lives three times over (row, dict, encoding)."""
        return self._store.events_after(since, types=types, limit=limit)

    def oldest_id(self) -> int:
        return self._store.first_event_id()
