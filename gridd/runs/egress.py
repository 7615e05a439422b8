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
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

#: A request's head (request line and headers) must fit in this and arrive within the
#: timeout; the upstream connection must be made within the same.
HEAD_LIMIT = 16 * 1024
TIMEOUT_SECONDS = 10.0
#: Bytes moved per read through an allowed connection.
CHUNK = 256 * 1024
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


class RunProxy:
    """The proxy of one run: a listener on loopback, allowing ``rules`` only."""

    def __init__(self, run: str, rules: list[HostRule], on_denied: Callable[[str], None]):
        self.run = run
        self.rules = rules
        self.on_denied = on_denied
        self.server: asyncio.Server | None = None
        self.port = 0
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, port: int = 0) -> int:
        self.server = await asyncio.start_server(
            self._serve, LOOPBACK, port, limit=HEAD_LIMIT, reuse_address=True
        )
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            upstream = await self._open(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            if upstream is None:
                self._writers.discard(writer)
                writer.transport.abort()

    async def _open(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> asyncio.StreamWriter | None:
        """Read the request's head, decide, and pipe an allowed one both ways to its end."""
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT_SECONDS)
        line, _, headers = head.partition(b"\r\n")
        method, target, version = [*line.decode("latin-1").split(" "), "", ""][:3]
        tunnel = method.upper() == "CONNECT"
        if tunnel:
            host, port = split_host_port(target)
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                await _answer(writer, 400, "the proxy takes CONNECT, or a request for http://")
                return None
            host, port = url.hostname, url.port or 80
        if port is None or not host:
            await _answer(writer, 400, f"no host:port in {target!r}")
            return None
        spelled = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if not allowed(host, port, self.rules):
            self.on_denied(spelled)
            await _answer(writer, 403, f"gridd sandbox: {spelled} is not in this run's allow_hosts")
            return None
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=CHUNK), TIMEOUT_SECONDS
            )
        except (OSError, TimeoutError) as exc:
            await _answer(writer, 502, f"gridd sandbox proxy: {spelled}: {exc}")
            return None
        self._writers.add(up_writer)
        if tunnel:
            writer.write(f"{version or 'HTTP/1.1'} 200 Connection established\r\n\r\n".encode())
        else:
            path = url.path or "/"
            origin = f"{method} {path}{'?' + url.query if url.query else ''} {version}"
            kept = [h for h in headers.split(b"\r\n") if not h.lower().startswith(b"proxy-")]
            up_writer.write(origin.encode("latin-1") + b"\r\n" + b"\r\n".join(kept))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                self._writers.discard(end)
                end.transport.abort()
        return up_writer


async def _answer(writer: asyncio.StreamWriter, status: int, text: str) -> None:
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
    body = (text + "\n").encode()
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(OSError):
        await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close: the other way may still be talking."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.transport.abort()


class EgressProxies:
    """The proxies of this daemon's runs, by run (agent id)."""

    def __init__(self, on_denied: OnDenied, *, limit: DenialLimit | None = None) -> None:
        self.on_denied = on_denied
        self.limit = limit or DenialLimit()
        self.proxies: dict[str, RunProxy] = {}

    async def open(self, run: str, hosts: Iterable[str], *, port: int = 0) -> int:
        """Start the proxy of ``run`` (again, after a restart: on its ``port``) and return
        its port. Raises ``OSError`` when that port cannot be had."""
        self.close(run)
        rules = [HostRule.parse(h) for h in hosts]
        proxy = RunProxy(run, rules, lambda target: self._denied(run, target))
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

    def _denied(self, run: str, target: str) -> None:
        log.info("sandbox: run %s may not reach %s", run, target)
        held = self.limit.take(run)
        if held is not None:
            self.on_denied(run, target, held)
