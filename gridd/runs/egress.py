"""The egress proxy: a sandboxed run's only way out when its ``network`` is ``allowlist``.

The daemon runs one small HTTP proxy per such run, on loopback, on a port of the run's own.
The run's Landlock ruleset lets it connect to that TCP port and to no other
(``runs/landlock.py``), and its environment names the proxy (``HTTPS_PROXY``,
``HTTP_PROXY``, ``ALL_PROXY``: ``proxy_env``). The proxy serves ``CONNECT host:port`` (HTTPS
or any other TLS: it never sees inside the tunnel) and plain-HTTP requests in absolute form
(``GET http://host:port/path``), to the hosts of the profile's ``allow_hosts`` only
(``allowed``, a pure decision). Any other is answered ``403`` and reported through
``on_denied`` (the pool publishes ``agent.sandbox_denied``; ``DenialLimit`` keeps a run that
tries host after host from flooding the event log).

One port per run: the port says which run is asking (no credentials travel, and a run can
reach only its own proxy, with its own list). The proxy resolves the names itself, so the
list is of names as the agent spells them: ``CONNECT 1.2.3.4:443`` is not
``api.anthropic.com`` whatever that name resolves to. A plain-HTTP connection, once allowed,
goes on to the same server for every request sent on it.

The daemon holds the proxies: while it is away (a restart), a run's connections through it
fail, and the restarted daemon opens the proxy of each live run again on the port it had
(recorded with the run's sandbox): the agent's ruleset names that port for good.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

#: A request's head (request line and headers) must fit in this and arrive within the
#: timeout; the upstream connection must be made within the same.
HEAD_LIMIT = 16 * 1024
TIMEOUT_SECONDS = 10.0
#: Bytes read at once from either end of an allowed connection (allocated once it is).
BUFFER = 256 * 1024
#: Connections of one run open at once; more are answered 503 (a run cannot make the
#: daemon hold its buffers without end).
MAX_CONNECTIONS = 64
#: A host listed without a port: HTTPS and HTTP.
DEFAULT_PORTS = (443, 80)
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class HostRule:
    """One ``allow_hosts`` entry: ``host`` (lower case; ``wildcard``: its subdomains, not
    itself), and its port (None: ``DEFAULT_PORTS``)."""

    host: str
    port: int | None = None
    wildcard: bool = False

    @classmethod
    def parse(cls, text: str) -> HostRule:
        host, port = split_host_port(text.strip())
        wildcard = host.startswith("*.")
        return cls(host=host[2:] if wildcard else host, port=port, wildcard=wildcard)

    def matches(self, host: str, port: int) -> bool:
        if port not in ((self.port,) if self.port is not None else DEFAULT_PORTS):
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host


def split_host_port(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` -> (host in lower case, port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    return host.lower().rstrip("."), int(port) if port.isdigit() else None


def allowed(host: str, port: int, rules: Iterable[HostRule]) -> bool:
    """Whether a run with these rules may reach ``host:port`` (the name as it asked)."""
    host = host.lower().rstrip(".")
    return any(rule.matches(host, port) for rule in rules)


def proxy_env(port: int) -> dict[str, str]:
    """The environment that sends a run's HTTP clients through its proxy. ``NO_PROXY`` is
    emptied: a direct connection would be refused by the kernel anyway, and through the
    proxy a refusal is at least reported."""
    url = f"http://{LOOPBACK}:{port}"
    env = {"NO_PROXY": "", "no_proxy": ""}
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = url
    return env


class DenialLimit:
    """At most ``burst`` reports per run in any ``window`` seconds; the ones held back are
    counted and said with the next report that goes out."""

    def __init__(self, *, burst: int = 10, window: float = 60.0) -> None:
        self.burst = burst
        self.window = window
        self._sent: dict[str, list[float]] = {}
        self._held: dict[str, int] = {}

    def take(self, run: str, now: float | None = None) -> int | None:
        """None: hold this one back; else report it, with how many were held before it."""
        now = time.monotonic() if now is None else now
        sent = [t for t in self._sent.get(run, ()) if now - t < self.window]
        if len(sent) >= self.burst:
            self._sent[run] = sent
            self._held[run] = self._held.get(run, 0) + 1
            return None
        self._sent[run] = [*sent, now]
        return self._held.pop(run, 0)

    def forget(self, run: str) -> None:
        self._sent.pop(run, None)
        self._held.pop(run, None)


#: ``on_denied(run, target, held)``: ``target`` is ``host:port``; ``held``, how many
#: refusals of this run went unreported before this one (``DenialLimit``).
OnDenied = Callable[[str, str, int], None]
#: Starts a named background task (``Background.spawn``): a connection to make upstream.
Spawn = Callable[[str, Coroutine[Any, Any, None]], "asyncio.Task[Any]"]


class BadRequest(ValueError):
    """A request's head the proxy cannot serve (answered ``400``)."""


@dataclass(frozen=True)
class Request:
    """What a request's head asks the proxy for."""

    host: str
    port: int
    #: ``CONNECT``: a tunnel, answered ``200`` once the server is reached.
    tunnel: bool
    #: What goes to the server first: for a plain-HTTP request, its head in origin form
    #: (``GET /path``), without the ``Proxy-*`` headers; nothing for a tunnel.
    forward: bytes = b""

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_head(head: bytes) -> Request:
    """The request a head (request line and headers, up to the blank line) makes."""
    line, _, headers = head.partition(b"\r\n")
    method, target, version = [*line.decode("latin-1").split(" "), "", ""][:3]
    if method.upper() == "CONNECT":
        host, port = split_host_port(target)
        if port is None or not host:
            raise BadRequest(f"no host:port in {target!r}")
        return Request(host=host, port=port, tunnel=True)
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        raise BadRequest("the proxy takes CONNECT, or a request for http://")
    try:
        port = url.port or 80
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    origin = f"{method} {url.path or '/'}{'?' + url.query if url.query else ''} {version}"
    kept = [h for h in headers.split(b"\r\n") if not h.lower().startswith(b"proxy-")]
    forward = origin.encode("latin-1") + b"\r\n" + b"\r\n".join(kept)
    return Request(host=url.hostname.lower(), port=port, tunnel=False, forward=forward)


def answer(status: int, text: str) -> bytes:
    """A whole HTTP answer from the proxy itself."""
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Unavailable"}[status]
    body = (text + "\n").encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )


class _End(asyncio.BufferedProtocol):
    """One end of a relayed connection: what it receives goes to its peer as it comes, with
    the transports' flow control (a peer that cannot take more pauses our reading). Read
    into a buffer of its own, reused: no new object per read (a transport's ``write``
    keeps a copy of what it could not send at once)."""

    def __init__(self, proxy: RunProxy, peer: _End | None = None) -> None:
        self.proxy = proxy
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.ended = False  # the other side sent EOF
        self.buffer = memoryview(b"")

    def get_buffer(self, sizehint: int) -> memoryview:
        if not self.buffer:
            self.buffer = memoryview(bytearray(self.buffer_size()))
        return self.buffer

    def buffer_size(self) -> int:
        return BUFFER

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.buffer[:nbytes])

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.proxy.transports.add(self.transport)
        if self.peer is not None:  # the server's end: quiet until the client is answered
            self.peer.peer = self
            self.transport.pause_reading()

    def data_received(self, data: memoryview) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)

    def eof_received(self) -> bool:
        self.ended = True
        peer = self.peer.transport if self.peer is not None else None
        if peer is None or peer.is_closing() or self.peer is None or self.peer.ended:
            self._close()
            return False
        if peer.can_write_eof():
            peer.write_eof()  # half-closed: the other way may still be talking
            return True
        return False

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.transports.discard(self.transport)
        self._close()

    def _close(self) -> None:
        """Close both ends, each once what it has to send is sent."""
        for end in (self, self.peer):
            if end is not None and end.transport is not None:
                end.transport.close()


class _Client(_End):
    """The agent's end: its request's head first, then the decision, then the relay."""

    def __init__(self, proxy: RunProxy) -> None:
        super().__init__(proxy)
        self.head = bytearray()
        self.deciding = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.proxy.clients += 1
        if self.proxy.clients > MAX_CONNECTIONS:
            self._refuse(503, f"gridd sandbox proxy: more than {MAX_CONNECTIONS} connections")
            return
        self.timer = asyncio.get_running_loop().call_later(TIMEOUT_SECONDS, self._too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.clients -= 1
        if self.timer is not None:
            self.timer.cancel()
        super().connection_lost(exc)

    def buffer_size(self) -> int:
        """A head first (the big buffer once the connection is allowed)."""
        return BUFFER if self.deciding else HEAD_LIMIT + 1

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.deciding and len(self.buffer) < BUFFER:
            self.buffer = memoryview(b"")
        return super().get_buffer(sizehint)

    def data_received(self, data: memoryview) -> None:
        if self.deciding:
            super().data_received(data)
            return
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > HEAD_LIMIT:
                self._refuse(400, "the request's head is too long")
            return
        self.deciding = True
        assert self.transport is not None
        self.transport.pause_reading()  # until the server is reached
        if self.timer is not None:
            self.timer.cancel()
        head, rest = bytes(self.head[: end + 4]), bytes(self.head[end + 4 :])
        self.proxy.spawn(f"egress:{self.proxy.run}", self._relay(head, rest))

    def eof_received(self) -> bool:
        if not self.deciding:
            return False  # gone before it asked for anything: close
        return super().eof_received()

    def _too_slow(self) -> None:
        if not self.deciding and self.transport is not None:
            self.transport.abort()

    def _refuse(self, status: int, text: str) -> None:
        if self.transport is not None:
            self.transport.write(answer(status, text))
            self.transport.close()

    async def _relay(self, head: bytes, rest: bytes) -> None:
        """Decide; reach the server of an allowed request, then let both ways flow."""
        try:
            request = parse_head(head)
        except BadRequest as exc:
            self._refuse(400, str(exc))
            return
        if not allowed(request.host, request.port, self.proxy.rules):
            self.proxy.on_denied(request.target)
            self._refuse(403, f"gridd sandbox: {request.target} is not in this run's allow_hosts")
            return
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.create_connection(
                    lambda: _End(self.proxy, peer=self), request.host, request.port
                ),
                TIMEOUT_SECONDS,
            )
        except (OSError, TimeoutError) as exc:
            self._refuse(502, f"gridd sandbox proxy: {request.target}: {exc}")
            return
        server = self.peer.transport if self.peer is not None else None
        if server is None or self.transport is None or self.transport.is_closing():
            self._close()  # the agent hung up meanwhile
            return
        if request.tunnel:
            self.transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        server.write(request.forward + rest)
        server.resume_reading()
        self.transport.resume_reading()


class RunProxy:
    """The proxy of one run: a listener on loopback, allowing ``rules`` only."""

    def __init__(
        self, run: str, rules: list[HostRule], *, on_denied: Callable[[str], None], spawn: Spawn
    ) -> None:
        self.run = run
        self.rules = rules
        self.on_denied = on_denied
        self.spawn = spawn
        self.server: asyncio.Server | None = None
        self.port = 0
        self.transports: set[asyncio.Transport] = set()
        self.clients = 0  # the agent's connections open

    async def start(self, port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: _Client(self), LOOPBACK, port, reuse_address=True
        )
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for transport in list(self.transports):
            transport.abort()
        self.transports.clear()


class EgressProxies:
    """The proxies of this daemon's runs, by run (agent id)."""

    def __init__(
        self, on_denied: OnDenied, *, spawn: Spawn | None = None, limit: DenialLimit | None = None
    ) -> None:
        self.on_denied = on_denied
        self.spawn = spawn or self._spawn
        self.limit = limit or DenialLimit()
        self.proxies: dict[str, RunProxy] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def open(self, run: str, hosts: Iterable[str], *, port: int = 0) -> int:
        """Start the proxy of ``run`` (again, after a restart: on its ``port``) and return
        its port. Raises ``OSError`` when that port cannot be had."""
        self.close(run)
        rules = [HostRule.parse(h) for h in hosts]
        proxy = RunProxy(
            run, rules, on_denied=lambda target: self._denied(run, target), spawn=self.spawn
        )
        await proxy.start(port)
        self.proxies[run] = proxy
        return proxy.port

    def close(self, run: str) -> None:
        proxy = self.proxies.pop(run, None)
        if proxy is not None:
            proxy.close()
        self.limit.forget(run)

    def close_all(self) -> None:
        for run in list(self.proxies):
            self.close(run)

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[Any]:
        """Without a ``Background`` (a benchmark): a task held until it is done."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _denied(self, run: str, target: str) -> None:
        log.info("sandbox: run %s may not reach %s", run, target)
        held = self.limit.take(run)
        if held is not None:
            self.on_denied(run, target, held)
