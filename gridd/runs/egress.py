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

The proxy reads a request's head on the event loop (a task per connection), and hands
the two sockets of an allowed one to a relay (``runs/relay.py``): on Linux, ``splice``
threads that move its bytes off the event loop, zero-copy; elsewhere a pair of asyncio
protocols.

The daemon holds the proxies: while it is away (a restart), a run's connections through it
fail, and the restarted daemon opens the proxy of each live run again on the port it had
(recorded with the run's sandbox): the agent's ruleset names that port for good.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gridd.runs.relay import SPLICE, Relay, make_relay

log = logging.getLogger(__name__)

#: A request's head (request line and headers) must fit in this and arrive within the
#: timeout; the upstream connection must be made within the same.
HEAD_LIMIT = 16 * 1024
TIMEOUT_SECONDS = 10.0
#: Connections of one run open at once; more are answered 503 (a run cannot make the
#: daemon hold its buffers without end).
MAX_CONNECTIONS = 64
#: Connections taken at once when the listener is readable; and, when accepting fails (out
#: of descriptors), how long before the next try.
ACCEPT_BATCH = 16
ACCEPT_RETRY_SECONDS = 1.0
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

    def take(self, run: str, now: float | None = None, *, unreported: int = 0) -> int | None:
        """None: hold this one back; else report it, with how many were held before it.
        ``unreported``: refusals this one stands for besides itself (the shim's count of
        those it held back: ``runs/refusals.py``), held or said with it."""
        now = time.monotonic() if now is None else now
        sent = [t for t in self._sent.get(run, ()) if now - t < self.window]
        if len(sent) >= self.burst:
            self._sent[run] = sent
            self._held[run] = self._held.get(run, 0) + 1 + unreported
            return None
        self._sent[run] = [*sent, now]
        return self._held.pop(run, 0) + unreported

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


async def _read_head(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> tuple[bytes, bytes]:
    """A request's head (up to its blank line) and what came after it; ``BadRequest`` if it
    is too long, ``EOFError`` if the agent hung up first."""
    head = bytearray()
    while (end := head.find(b"\r\n\r\n")) < 0:
        if len(head) > HEAD_LIMIT:
            raise BadRequest("the request's head is too long")
        data = await loop.sock_recv(conn, HEAD_LIMIT + 1 - len(head))
        if not data:
            raise EOFError
        head += data
    return bytes(head[: end + 4]), bytes(head[end + 4 :])


async def _connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A socket connected to ``host:port`` (each of its addresses in turn)."""
    infos: list[tuple[Any, ...]]
    try:  # an address needs no lookup (in the loop's executor, a thread's round trip)
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        infos = [(family, socket.SOCK_STREAM, 0, "", (host, port))]
    except ValueError:
        infos = list(await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))
    error: OSError = OSError(f"{host} has no address")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
        else:
            return sock
    raise error


class RunProxy:
    """The proxy of one run: a listener on loopback, allowing ``rules`` only.

    A task per connection (``_serve``) reads its request's head, decides, reaches the
    server and answers; an allowed connection's two sockets then go to a relay
    (``runs/relay.py``), which owns them from there. ``close`` ends them all: the listener,
    the connections still asking and every relay, at once."""

    def __init__(
        self,
        run: str,
        rules: list[HostRule],
        *,
        on_denied: Callable[[str], None],
        spawn: Spawn,
        splice: bool = SPLICE,
    ) -> None:
        self.run = run
        self.rules = rules
        self.on_denied = on_denied
        self.spawn = spawn
        self.splice = splice
        self.listener: socket.socket | None = None
        self.port = 0
        self.serving: set[asyncio.Task[Any]] = set()  # one per connection open
        self.relays: set[Relay] = set()

    async def start(self, port: int = 0) -> int:
        self.loop = asyncio.get_running_loop()
        self.listener = socket.create_server((LOOPBACK, port))  # SO_REUSEADDR: a restart
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])
        self._listen()
        return self.port

    def close(self) -> None:
        if self.listener is not None:
            self.loop.remove_reader(self.listener.fileno())  # before its number is free
            self.listener.close()
            self.listener = None
        for relay in list(self.relays):
            relay.abort()  # now, not at the tasks' next turn
        for task in list(self.serving):
            task.cancel()

    def _listen(self) -> None:
        if self.listener is not None:
            self.loop.add_reader(self.listener.fileno(), self._accept, self.listener)

    def _accept(self, listener: socket.socket) -> None:
        """The listener is readable: take the connections waiting (a batch at most)."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: they wait in the backlog meanwhile
                log.warning("sandbox proxy of run %s: %s; accepting again in 1 s", self.run, exc)
                self.loop.remove_reader(listener.fileno())
                self.loop.call_later(ACCEPT_RETRY_SECONDS, self._listen)
                return
            conn.setblocking(False)
            if len(self.serving) >= MAX_CONNECTIONS:
                text = f"gridd sandbox proxy: more than {MAX_CONNECTIONS} connections"
                self.spawn(f"egress:{self.run}:refuse", self._refuse(conn, 503, text))
                continue
            task = self.spawn(f"egress:{self.run}:connection", self._serve(conn))
            self.serving.add(task)
            task.add_done_callback(self.serving.discard)

    async def _serve(self, conn: socket.socket) -> None:
        """One connection of the agent's: asked, decided, answered, then relayed."""
        try:
            server = await self._ask(conn)
        except BaseException:
            conn.close()
            raise
        if server is None:
            conn.close()
            return
        relay = make_relay(conn, server, name=f"egress:{self.run}", splice=self.splice)
        self.relays.add(relay)
        try:
            await relay.run()
        finally:
            self.relays.discard(relay)

    async def _ask(self, conn: socket.socket) -> socket.socket | None:
        """The server an allowed request reaches, the agent told so and the request's
        first bytes sent on; None once the request is refused (and answered)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(TIMEOUT_SECONDS):
                head, rest = await _read_head(loop, conn)
            request = parse_head(head)
        except (TimeoutError, EOFError, OSError):
            return None  # too slow, or gone before it asked for anything
        except BadRequest as exc:
            await self._answer(conn, 400, str(exc))
            return None
        if not allowed(request.host, request.port, self.rules):
            self.on_denied(request.target)
            text = f"gridd sandbox: {request.target} is not in this run's allow_hosts"
            await self._answer(conn, 403, text)
            return None
        try:
            async with asyncio.timeout(TIMEOUT_SECONDS):
                server = await _connect(loop, request.host, request.port)
        except (OSError, TimeoutError) as exc:
            await self._answer(conn, 502, f"gridd sandbox proxy: {request.target}: {exc}")
            return None
        try:
            if request.tunnel:
                await loop.sock_sendall(conn, b"HTTP/1.1 200 Connection established\r\n\r\n")
            if request.forward or rest:
                await loop.sock_sendall(server, request.forward + rest)
        except OSError:
            server.close()  # either end hung up meanwhile
            return None
        except BaseException:
            server.close()
            raise
        return server

    async def _answer(self, conn: socket.socket, status: int, text: str) -> None:
        try:
            async with asyncio.timeout(TIMEOUT_SECONDS):
                await asyncio.get_running_loop().sock_sendall(conn, answer(status, text))
        except (OSError, TimeoutError):
            pass  # it hung up, or reads nothing: it is refused all the same

    async def _refuse(self, conn: socket.socket, status: int, text: str) -> None:
        try:
            await self._answer(conn, status, text)
        finally:
            conn.close()


class EgressProxies:
    """The proxies of this daemon's runs, by run (agent id)."""

    def __init__(
        self,
        on_denied: OnDenied,
        *,
        spawn: Spawn | None = None,
        limit: DenialLimit | None = None,
        splice: bool = SPLICE,
    ) -> None:
        self.on_denied = on_denied
        self.splice = splice
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
            run,
            rules,
            on_denied=lambda target: self._denied(run, target),
            spawn=self.spawn,
            splice=self.splice,
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
