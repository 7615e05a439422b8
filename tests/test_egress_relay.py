"""An allowed proxy connection is relayed byte for byte, both ways, with half-closes passed
on; on Linux off the event loop (``splice`` threads, ``runs/relay.py``), elsewhere in it;
and closing a run's proxy ends its connections at once, busy or quiet, leaving no
descriptor and no thread behind.

Real sockets on loopback: the proxy (``EgressProxies``) runs its event loop in a thread of
the test's, the servers and the agent's side are plain blocking sockets. Each test runs
with both relays (``splice``: the zero-copy one; ``stream``: the portable one).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
import time
from asyncio import selector_events
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from gridd.runs import egress, relay
from tests.support.waits import wait_for

MB = 1024 * 1024
RELAYS = [
    pytest.param(True, id="splice", marks=pytest.mark.skipif(not relay.SPLICE, reason="no splice")),
    pytest.param(False, id="stream"),
]


class ProxyLoop:
    """``EgressProxies`` on an event loop of its own, in a thread."""

    def __init__(self, *, splice: bool) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="proxy-loop")
        self.thread.start()
        self.denied: list[str] = []
        self.proxies = self.call(self._make(splice))

    async def _make(self, splice: bool) -> egress.EgressProxies:
        return egress.EgressProxies(
            lambda run, target, held: self.denied.append(target), splice=splice
        )

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def run(self, fn: Callable[[], Any]) -> Any:
        async def inside() -> Any:
            return fn()

        return self.call(inside())

    def open(self, run: str, hosts: list[str]) -> int:
        return int(self.call(self.proxies.open(run, hosts)))

    def stop(self) -> None:
        self.run(self.proxies.close_all)

        async def drain() -> None:  # the tasks the proxies still hold end (as a daemon's stop)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.call(drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


class Upstream:
    """A server on loopback running ``handle(conn)`` for each connection, in a thread."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self.handle = handle
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.handle(conn)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def _recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while data := sock.recv(MB):
        chunks.append(data)
    return b"".join(chunks)


def _tunnel(proxy_port: int, target_port: int) -> socket.socket:
    """The agent's side: a CONNECT through the proxy, answered 200."""
    sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=30)
    sock.sendall(f"CONNECT 127.0.0.1:{target_port} HTTP/1.1\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        assert byte, answer
        answer += byte
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    return sock


def _open_fds() -> dict[str, str]:
    """This process's descriptors and what each is (not the one that listed them)."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            pass  # the listing's own, closed since
    return found


def _relay_threads() -> list[str]:
    """The threads relaying a connection now (named for their run and way)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("egress:")]


def _threads() -> set[int | None]:
    return {t.ident for t in threading.enumerate()}


@pytest.fixture(params=RELAYS)
def proxy(request: pytest.FixtureRequest) -> Iterator[ProxyLoop]:
    loop = ProxyLoop(splice=request.param)
    try:
        yield loop
    finally:
        loop.stop()


def test_a_tunnel_carries_both_ways_and_passes_a_half_close_on(proxy: ProxyLoop) -> None:
    """The agent sends its request and shuts its write side; the server, seeing that EOF,
    answers with what it got, hashed, and a large body; the agent still receives it all."""
    body = os.urandom(3 * MB)

    def answer_after_eof(conn: socket.socket) -> None:
        got = _recv_all(conn)  # until the agent's half-close reaches it
        conn.sendall(hashlib.sha256(got).digest() + body)

    server = Upstream(answer_after_eof)
    try:
        port = proxy.open("run", [f"127.0.0.1:{server.port}"])
        request = os.urandom(2 * MB + 7)
        with _tunnel(port, server.port) as agent:
            agent.sendall(request)
            agent.shutdown(socket.SHUT_WR)
            received = _recv_all(agent)
        assert received[:32] == hashlib.sha256(request).digest()
        assert len(received) == 32 + len(body) and received[32:] == body
    finally:
        server.close()


def test_a_large_download_arrives_byte_exact(proxy: ProxyLoop) -> None:
    """40 MB, past the size where the splice relay's pipes grow, hashed at both ends."""
    body = os.urandom(40 * MB)

    def send(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(body)

    server = Upstream(send)
    try:
        port = proxy.open("run", [f"127.0.0.1:{server.port}"])
        with _tunnel(port, server.port) as agent:
            agent.sendall(b"GET / HTTP/1.1\r\n\r\n")
            digest = hashlib.sha256()
            size = 0
            while data := agent.recv(MB):
                digest.update(data)
                size += len(data)
        assert size == len(body) and digest.digest() == hashlib.sha256(body).digest()
    finally:
        server.close()


@pytest.mark.skipif(not relay.SPLICE, reason="no splice here: the relay is the event loop's")
def test_a_spliced_tunnel_flows_while_the_event_loop_is_busy() -> None:
    """The bytes of an allowed connection never pass through the event loop: with the
    proxy's loop held (a daemon busy elsewhere), 20 MB still go through, both ways."""
    proxy = ProxyLoop(splice=True)
    body = os.urandom(20 * MB)

    def echo(conn: socket.socket) -> None:
        while data := conn.recv(MB):
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)

    server = Upstream(echo)
    held, release, returned = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(60)
        returned.set()

    try:
        port = proxy.open("run", [f"127.0.0.1:{server.port}"])
        with _tunnel(port, server.port) as agent:
            proxy.loop.call_soon_threadsafe(hold)
            assert held.wait(30)
            sender = threading.Thread(target=lambda: (agent.sendall(body), agent.shutdown(1)))
            sender.start()
            echoed = _recv_all(agent)
            sender.join()
        assert not returned.is_set(), "the loop was let go before the transfer ended"
        assert hashlib.sha256(echoed).digest() == hashlib.sha256(body).digest()
    finally:
        release.set()
        server.close()
        proxy.stop()


@pytest.mark.parametrize("busy", [True, False], ids=["mid-transfer", "quiet"])
def test_closing_a_runs_proxy_ends_its_tunnels_and_frees_their_fds_and_threads(
    proxy: ProxyLoop, busy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-transfer (the server sending without end faster than the agent reads) or quiet
    (both ends silent: the relay waiting to read), closing the run's proxy ends the tunnel:
    both ends see it end, and no descriptor or thread of it is left (the relay's threads,
    kept a while for the next connection, end once idle: here after 0.2 s)."""
    monkeypatch.setattr(relay, "IDLE_SECONDS", 0.2)

    def flood(conn: socket.socket) -> None:
        chunk = b"x" * MB
        while busy:
            conn.sendall(chunk)  # until the proxy's side goes
        conn.recv(1)

    server = Upstream(flood)
    try:
        fds_before, threads_before = _open_fds(), _threads()
        port = proxy.open("run", [f"127.0.0.1:{server.port}"])
        agent = _tunnel(port, server.port)
        wait_for(lambda: server.connections, message="the tunnel to reach the server")
        if busy:
            assert agent.recv(65536)  # flowing
        else:
            relaying = lambda: proxy.run(lambda: proxy.proxies.proxies["run"].relays)  # noqa: E731
            wait_for(relaying, message="the relay to start")
        proxy.run(lambda: proxy.proxies.close("run"))
        try:
            while agent.recv(MB):  # what was on its way, then the end
                pass
        except ConnectionResetError:
            pass
        agent.close()
        wait_for(lambda: not _relay_threads(), timeout=10, message="the relay's ways to end")
        wait_for(lambda: _threads() <= threads_before, timeout=10, message="its threads to end")
        # The listener, both sockets of the tunnel and the relay's pipes; the server's end.
        wait_for(lambda: _open_fds() == fds_before, timeout=10, message="descriptors to close")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        server.close()


class _ReadingBeforeItsPauseTransport(selector_events._SelectorSocketTransport):
    """Python 3.11.2's socket transport (before CPython gh-103607), on any version: it
    starts reading once made, even if ``connection_made`` paused it."""

    def _add_reader(self, fd: int, callback: Any, *args: Any) -> None:
        if not self._closing:  # 3.11.2's test; later ones also skip a paused transport
            self._loop._add_reader(fd, callback, *args)


class _ReadingBeforeItsPauseLoop(asyncio.SelectorEventLoop):
    def _make_socket_transport(  # type: ignore[override]
        self,
        sock: socket.socket,
        protocol: Any,
        waiter: Any = None,
        *,
        extra: Any = None,
        server: Any = None,
    ) -> _ReadingBeforeItsPauseTransport:
        return _ReadingBeforeItsPauseTransport(self, sock, protocol, waiter, extra, server)


LOOPS = [
    pytest.param(asyncio.SelectorEventLoop, id="this-python"),
    pytest.param(_ReadingBeforeItsPauseLoop, id="reading-before-its-pause-holds"),
]


def _connection(*, rcvbuf: int = 0) -> tuple[socket.socket, socket.socket]:
    """Both ends of a TCP connection on loopback: (the connecting one, the accepted one,
    asking for a receive buffer of ``rcvbuf`` bytes if given)."""
    with socket.socket() as listener:
        if rcvbuf:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        near = socket.create_connection(listener.getsockname(), timeout=30)
        far, _ = listener.accept()
    far.settimeout(30)
    return near, far


def _waiting(sock: socket.socket, size: int) -> bool:
    """Whether more than ``size`` bytes wait to be read from ``sock``."""
    return len(sock.recv(size + 1, socket.MSG_PEEK)) > size


def _relay_from_a_full_read(
    loop: asyncio.AbstractEventLoop,
    request: bytes,
    agent: socket.socket,
    client: socket.socket,
    server: socket.socket,
    upstream: Callable[[], None],
) -> None:
    """The agent sends ``request`` and half-closes while ``upstream`` serves the far end,
    each in a thread; a ``StreamRelay`` between ``client`` (the agent's connection) and
    ``server``, on ``loop``, starts once more than a read of it waits, and runs to its end."""
    sender = threading.Thread(target=lambda: (agent.sendall(request), agent.shutdown(1)))
    far_end = threading.Thread(target=upstream)
    sender.start()
    far_end.start()
    try:
        wait_for(lambda: _waiting(client, relay.BUFFER), message="a full read to wait")
        stream = relay.StreamRelay(client, server, name="egress:run")
        loop.run_until_complete(asyncio.wait_for(stream.run(), 120))
    finally:
        sender.join(30)
        far_end.join(30)
        loop.close()


def _difference(got: bytes, sent: bytes) -> str:
    """Where what arrived first differs from what was sent."""
    at = next((i for i, (a, b) in enumerate(zip(got, sent, strict=False)) if a != b), None)
    return f"{len(got)} of {len(sent)} bytes arrived, the first difference at byte {at}"


@pytest.mark.parametrize("make_loop", LOOPS)
def test_what_the_agent_sends_before_the_stream_relay_starts_arrives_first_and_in_order(
    make_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """The agent sends as soon as it has the proxy's answer: its transport, made before the
    server's, reads some before the relay can write it on (on Python 3.11.2, even though
    it was paused). 8 MB sent without pause from before the relay starts arrive whole and
    in order, and the half-close after them; the answer comes back."""
    request = os.urandom(8 * MB)
    agent, client = _connection(rcvbuf=4 * MB)
    server, upstream = _connection()
    got: list[bytes] = []

    def answer_after_eof() -> None:
        with upstream:
            got.append(_recv_all(upstream))
            upstream.sendall(hashlib.sha256(got[0]).digest())

    with agent:
        _relay_from_a_full_read(make_loop(), request, agent, client, server, answer_after_eof)
        answer = _recv_all(agent)
    assert got[0] == request, _difference(got[0], request)
    assert answer == hashlib.sha256(request).digest()


@pytest.mark.parametrize("make_loop", LOOPS)
def test_the_stream_relay_stops_reading_while_its_first_writes_wait_to_be_sent(
    make_loop: Callable[[], asyncio.AbstractEventLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent sends 16 MB at once, the server takes them slowly: what the relay read
    before it started, written on, fills the server's side past its flow control's mark;
    the agent's side is read no more until that drains, so the relay never holds more
    than two reads' worth (not the agent's 16 MB)."""
    request = os.urandom(16 * MB)
    agent, client = _connection(rcvbuf=4 * MB)
    server, upstream = _connection(rcvbuf=64 * 1024)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
    held: list[int] = []  # what the server's side had to send after each write to it
    buffer_updated = relay._End.buffer_updated

    def measured(end: relay._End, nbytes: int) -> None:
        buffer_updated(end, nbytes)
        if end.peer is not None and end.peer.transport is not None:
            held.append(end.peer.transport.get_write_buffer_size())

    monkeypatch.setattr(relay._End, "buffer_updated", measured)
    got = hashlib.sha256()

    def read_slowly() -> None:
        with upstream:
            while data := upstream.recv(64 * 1024):
                got.update(data)
                time.sleep(0.002)  # a slow server: pacing, not a wait for anything

    with agent:
        _relay_from_a_full_read(make_loop(), request, agent, client, server, read_slowly)
    assert held and max(held) <= 2 * relay.BUFFER, f"the relay held {max(held)} bytes"
    assert got.digest() == hashlib.sha256(request).digest()
