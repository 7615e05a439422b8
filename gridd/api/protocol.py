"""The HTTP protocol gridd serves on its socket: uvicorn's, with three guards at the wire.

Below the ASGI app, where no route or exception handler can help:

- peer credentials: a connection from any uid but the daemon's, or from a sandboxed agent,
  is answered 403 and closed before a byte of the request is read (see ``peercred``);
- a request uvicorn cannot even parse gets the JSON error body, not ``text/plain``;
- a peer that stops reading is cut off: once the transport has had to pause writing and
  not one byte of its buffer drained for ``stall_timeout`` seconds, the connection is
  aborted. A slow reader (64 KiB/s) drains a little in every such window and is kept. ``close()`` would wait forever to
  flush to a frozen client, keeping its socket and buffer; ``abort()`` frees both and ends
  its request (an SSE stream sees a disconnect).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string

from gridd.api.errors import raw_error_response
from gridd.api.peercred import (
    forbidden_response,
    peer_cred,
    sandboxed_peer,
    sandboxed_response,
)

log = logging.getLogger(__name__)

#: How long a refused peer may keep sending before its connection is closed regardless.
_LINGER_SECONDS = 2.0

#: Paths answered even past the connection cap, so a swamped daemon can be checked and stopped.
RESERVED_PATHS = frozenset({b"/health", b"/version", b"/shutdown"})
#: Connections past the cap that may still ask for a reserved path; beyond them, 503 at once.
RESERVED_SLOTS = 16
#: Headers of a connection past the cap must arrive this fast.
_RESERVED_HEADER_SECONDS = 2.0


class ConnectionGate:
    """Counts the open connections of one server, against ``cap``."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open = 0


async def _busy_app(scope: Any, receive: Any, send: Any) -> None:
    body = raw_error_response(
        503,
        "Service Unavailable",
        "too_many_connections",
        "gridd is serving too many connections; only /health, /version and /shutdown answer",
    )
    payload = body.partition(b"\r\n\r\n")[2]
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def gridd_protocol(
    *,
    allowed_uid: int,
    stall_timeout: float,
    header_timeout: float = 10.0,
    gate: ConnectionGate | None = None,
    base: type[asyncio.Protocol] | None = None,
    shim: str | None = None,
) -> type[asyncio.Protocol]:
    """Subclass uvicorn's HTTP protocol (``auto``: httptools, else h11) with the guards.
    ``shim``: the shim's path, to refuse the connections of sandboxed agents."""
    parent: Any = base if base is not None else import_from_string(HTTP_PROTOCOLS["httptools"])
    connections = gate if gate is not None else ConnectionGate(1_000_000)

    class GriddHTTPProtocol(parent):  # type: ignore[misc]
        _refused = False
        _counted = False
        _reserved_only = False
        _stall_timer: asyncio.TimerHandle | None = None
        _stall_unsent = 0  # the write buffer's size when the stall timer was (re)armed
        _header_timer: asyncio.TimerHandle | None = None
        _header_wait = header_timeout
        _headers_from: float | None = None  # loop time the current request's headers began

        def connection_made(self, transport: Any) -> None:
            sock = transport.get_extra_info("socket")
            pid, uid = (peer_cred(sock) if sock is not None else None) or (None, None)
            if uid is not None and uid != allowed_uid:
                log.warning("refused connection from uid %d", uid)
                self._refuse(transport, uid, forbidden_response(uid))
                return
            if pid is not None and shim is not None and sandboxed_peer(pid, shim):
                log.warning("refused connection from sandboxed process %d", pid)
                self._refuse(transport, uid or 0, sandboxed_response(pid))
                return
            if connections.open >= connections.cap + RESERVED_SLOTS:
                self._refuse(transport, 0, _busy_bytes())
                return
            connections.open += 1
            self._counted = True
            self._reserved_only = connections.open > connections.cap
            self._header_wait = _RESERVED_HEADER_SECONDS if self._reserved_only else header_timeout
            super().connection_made(transport)
            self._headers_from = self.loop.time()
            self._arm_header_timer(self._header_wait)

        def _arm_header_timer(self, delay: float) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(delay, self._headers_too_slow)

        def _headers_too_slow(self) -> None:
            # One timer per connection, not per request: a request's start only notes the
            # time, and the timer, when it fires, re-arms itself for what is left of the
            # wait of the request under way (if any). A keep-alive client asking thousands
            # of times a second costs no timer per request.
            self._header_timer = None
            started = self._headers_from
            if started is None or self.transport.is_closing():
                return  # between requests: uvicorn's keep-alive timeout applies there
            left = started + self._header_wait - self.loop.time()
            if left > 0:
                self._arm_header_timer(left)
                return
            self.transport.write(
                raw_error_response(
                    408,
                    "Request Timeout",
                    "header_timeout",
                    f"the request's headers did not arrive within {header_timeout:g}s",
                )
            )
            self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._headers_from = self.loop.time()
            self._arm_header_timer(self._header_wait)

        def on_headers_complete(self) -> None:
            self._headers_from = None
            if self._reserved_only and self.url.split(b"?")[0] not in RESERVED_PATHS:
                self.app = _busy_app
            super().on_headers_complete()

        def _refuse(self, transport: Any, uid: int, answer: bytes) -> None:
            # Answer, stop writing, and keep swallowing the request until the peer hangs
            # up (or briefly at most): closing with its request unread would reset the
            # connection, and the peer would see ECONNRESET instead of the answer.
            self._refused = True
            self._refused_transport = transport
            transport.write(answer)
            if transport.can_write_eof():
                transport.write_eof()
            self._linger = asyncio.get_running_loop().call_later(_LINGER_SECONDS, transport.close)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # never parsed
            super().data_received(data)

        def eof_received(self) -> bool | None:
            if self._refused:
                self._refused_transport.close()
                return False
            result: bool | None = super().eof_received()
            return result

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_stall_timer()
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            if self._counted:
                self._counted = False
                connections.open -= 1
            if self._refused:
                self._linger.cancel()
                return
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self.transport.write(
                raw_error_response(
                    400,
                    "Bad Request",
                    "malformed_http",
                    f"the request is not valid HTTP/1.1 ({msg.rstrip('.')})",
                )
            )
            self.transport.close()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._stall_timer is None:
                self._arm_stall_timer()

        def _arm_stall_timer(self) -> None:
            # Nothing more is written while paused (uvicorn awaits the drain first), so a
            # smaller buffer at the timer means the peer read something: progress.
            self._stall_unsent = self.transport.get_write_buffer_size()
            loop = asyncio.get_running_loop()
            self._stall_timer = loop.call_later(stall_timeout, self._abort_stalled)

        def resume_writing(self) -> None:
            self._cancel_stall_timer()
            super().resume_writing()

        def _cancel_stall_timer(self) -> None:
            if self._stall_timer is not None:
                self._stall_timer.cancel()
                self._stall_timer = None

        def _abort_stalled(self) -> None:
            self._stall_timer = None
            unsent = self.transport.get_write_buffer_size()
            if not self.transport.is_closing() and 0 < unsent < self._stall_unsent:
                self._arm_stall_timer()  # slow, not stalled: it read some of it
                return
            if not self.transport.is_closing() or unsent:
                log.warning(
                    "client stopped reading for %.1fs (%d bytes unsent); dropping the connection",
                    stall_timeout,
                    self.transport.get_write_buffer_size(),
                )
                self.transport.abort()

    def _busy_bytes() -> bytes:
        return raw_error_response(
            503,
            "Service Unavailable",
            "too_many_connections",
            "gridd is serving too many connections; try again shortly",
        )

    GriddHTTPProtocol.__name__ = f"Gridd{parent.__name__}"
    return GriddHTTPProtocol
