"""Reading the event stream (``GET /events``): one read until a condition, a follower
that resumes across daemon restarts, and the durable log replayed from the start."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gridd.client import GridClient, SSEEvent, SSEParser
from tests.support.waits import wait_for


@dataclass
class SSERead:
    """What one ``GET /events`` connection delivered."""

    events: list[SSEEvent] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    ended: bool = False  # the daemon closed the stream (as opposed to us stopping)

    @property
    def ids(self) -> list[int]:
        """Ids of log events (snapshots and resets repeat the position, so they are left out)."""
        return [
            e.id
            for e in self.events
            if e.id is not None and e.type not in {"state.snapshot", "reset"}
        ]

    def types(self) -> list[str]:
        return [e.type for e in self.events]


def read_sse(  # type: ignore[no-untyped-def]
    sock: Path,
    *,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    until=None,
    timeout: float = 15.0,
    started: threading.Event | None = None,
) -> SSERead:
    """Read ``GET /events`` until ``until(read)`` holds or the daemon ends the stream.

    Fails (AssertionError) when neither happens within ``timeout`` seconds.
    """
    read = SSERead()
    deadline = time.monotonic() + timeout
    parser = SSEParser()
    transport = httpx.HTTPTransport(uds=str(sock))
    http = httpx.Client(transport=transport, base_url="http://gridd")
    stream = http.stream(
        "GET", "/events", params=params, headers=headers, timeout=httpx.Timeout(10.0, read=timeout)
    )
    with http, stream as response:
        assert response.status_code == 200, response.read()
        if started is not None:
            started.set()
        try:
            for line in response.iter_lines():
                if line.startswith(":"):
                    read.comments.append(line)
                event = parser.feed_line(line)
                if event is not None:
                    read.events.append(event)
                if until is not None and until(read):
                    return read
                if time.monotonic() > deadline:
                    break
            else:
                read.ended = True
                return read
        except (httpx.RemoteProtocolError, httpx.ReadError):
            read.ended = True
            return read
        except httpx.ReadTimeout:
            pass
    raise AssertionError(f"SSE stream gave no result within {timeout}s; got {read.types()}")


def event_log(
    client: GridClient, *, types: set[str] | None = None, timeout: float = 15.0
) -> list[SSEEvent]:
    """Every event logged so far, oldest first, replayed from the durable log."""
    last = int(client.get("/state")["daemon"]["lastEventId"])
    out: list[SSEEvent] = []
    if last == 0:
        return out
    stream = client.events(since=0, read_timeout=timeout)
    try:
        for event in stream:
            if event.id is None:
                continue
            if types is None or event.type in types:
                out.append(event)
            if event.id >= last:
                return out
    finally:
        stream.close()  # type: ignore[attr-defined]
    raise AssertionError(f"event replay ended before event {last}")


def wait_for_events(
    client: GridClient, types: set[str], count: int, *, timeout: float = 30.0
) -> list[SSEEvent]:
    """The logged events of ``types`` once there are at least ``count`` of them."""
    events: list[SSEEvent] = wait_for(
        lambda: (found := event_log(client, types=types)) and len(found) >= count and found,
        timeout=timeout,
        interval=0.1,
        message=f"{count} event(s) of {sorted(types)}",
    )
    return events


class EventFollower:
    """One SSE client that follows ``GET /events`` in a thread for the whole test, and
    resumes with ``Last-Event-ID`` (its last seen id) whenever the stream breaks: the
    daemon was killed, stopped or restarted. Snapshots and resets are kept apart."""

    def __init__(self, sock: Path, *, since: int = 0, read_timeout: float = 2.0) -> None:
        self.sock = sock
        self.last_id = since
        self.read_timeout = read_timeout
        self.events: list[SSEEvent] = []
        self.other: list[SSEEvent] = []  # state.snapshot and reset
        self.connections = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-follower", daemon=True)

    def __enter__(self) -> EventFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.read_timeout + 10)

    def snapshot(self) -> list[SSEEvent]:
        with self._lock:
            return list(self.events)

    def wait(self, predicate, timeout: float = 30.0, message: str = ""):  # type: ignore[no-untyped-def]
        """Wait until ``predicate(events so far)`` is true; returns its value."""
        return wait_for(
            lambda: predicate(self.snapshot()), timeout=timeout, interval=0.05, message=message
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                transport = httpx.HTTPTransport(uds=str(self.sock))
                with (
                    httpx.Client(transport=transport, base_url="http://gridd") as http,
                    http.stream(
                        "GET",
                        "/events",
                        headers={"Last-Event-ID": str(self.last_id)},
                        timeout=httpx.Timeout(5.0, read=self.read_timeout),
                    ) as response,
                ):
                    if response.status_code != 200:
                        raise httpx.TransportError(f"status {response.status_code}")
                    self.connections += 1
                    parser = SSEParser()
                    for line in response.iter_lines():
                        event = parser.feed_line(line)
                        if event is None:
                            continue
                        with self._lock:
                            if event.type in {"state.snapshot", "reset"} or event.id is None:
                                self.other.append(event)
                            else:
                                self.events.append(event)
                                self.last_id = event.id
                        if self._stop.is_set():
                            return
            except (httpx.TransportError, OSError):
                pass
            self._stop.wait(0.05)
