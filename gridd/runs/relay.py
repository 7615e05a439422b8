"""The relay: the bytes of one allowed proxy connection, both ways, between the agent's
socket and the server's, until both ways are done (``runs/egress.py`` decides; this moves).

Two relays, one contract: ``await relay.run()`` returns once the connection is over, and
the relay closes both sockets; ``relay.abort()`` (from the event loop, at any time, any
number of times) ends it now. An EOF from one end goes on as a half-close
(``shutdown(SHUT_WR)``) to the other, whose way may still be talking; a reset or any other
error on either way ends both.

- ``SpliceRelay`` (Linux): a thread per way moves the bytes with ``splice(2)``, socket ->
  pipe -> socket: the kernel passes pages by reference, no byte is copied into Python and
  the event loop sees none of them. The sockets are blocking; ``abort`` shuts both down
  (``SHUT_RDWR``), which wakes a ``splice`` blocked on either (EOF, or ``EPIPE``), so a
  run's proxy closing, or the daemon stopping, never waits on a quiet connection. The
  last thread out closes the pipes and sockets, so no descriptor is closed under a
  ``splice`` still using it.
- ``StreamRelay`` (elsewhere, macOS): a pair of ``asyncio.BufferedProtocol``s in the event
  loop; each end reads into a buffer of its own and writes to its peer's transport, whose
  flow control pauses the reader. An end made before the other (the client's transport
  reads as soon as it is made) keeps its first read and pauses; the relay writes what both
  kept, in order, before either writes anything else.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
import queue
import socket
import sys
import threading
from collections.abc import Callable
from typing import cast

#: Whether this platform has ``splice(2)`` (``os.splice``: Linux, Python 3.10+).
SPLICE = sys.platform == "linux" and hasattr(os, "splice")
#: Each way's pipe starts at the kernel's default size (64 KB) and grows to ``BIG_PIPE``
#: once the way has moved ``GROW_AFTER`` bytes (a download, not an API's answers): one
#: ``splice`` then moves up to 1 MB, which halves the relay's CPU for a bulk transfer
#: against 64 KB. Pipe sizes count against the user's ``fs.pipe-user-pages-soft`` (64 MB
#: by default), past which every new pipe of the user's, the agents' own included, gets
#: two pages: at most ``BIG_PIPES`` grown at once in this process (16 MB).
BIG_PIPE = 1024 * 1024
GROW_AFTER = 4 * 1024 * 1024
BIG_PIPES = 16
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_big_pipes = threading.BoundedSemaphore(BIG_PIPES)
#: How long a relay thread without work waits for more before it ends.
IDLE_SECONDS = 30.0
#: Bytes read at once by ``StreamRelay``'s ends.
BUFFER = 256 * 1024


class _Workers:
    """The threads the splice relays' ways run in, kept a while once idle: starting a
    thread makes its starter (the event loop) wait until it runs, ~0.2 ms; an idle one
    takes the next way at once. One without work for ``IDLE_SECONDS`` ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = 0
        self._jobs: queue.SimpleQueue[tuple[str, Callable[[], None]]] = queue.SimpleQueue()

    def run(self, name: str, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._jobs.put((name, job))
                return
        threading.Thread(target=self._work, args=(name, job), name=name, daemon=True).start()

    def _work(self, name: str, job: Callable[[], None]) -> None:
        me = threading.current_thread()
        while True:
            me.name = name
            job()
            me.name = "relay:idle"
            with self._lock:
                self._idle += 1
            while True:
                try:
                    name, job = self._jobs.get(timeout=IDLE_SECONDS)
                    break
                except queue.Empty:
                    with self._lock:  # a job handed out is in the queue under the lock
                        if self._jobs.empty():
                            self._idle -= 1
                            return


_workers = _Workers()


class SpliceRelay:
    """Both ways of a connection in two threads, zero-copy (see the module's docstring)."""

    def __init__(self, client: socket.socket, server: socket.socket, *, name: str) -> None:
        self.name = name
        self.sockets = (client, server)
        self._lock = threading.Lock()  # abort (the loop) against the last thread's close
        self._left = 2
        self._closed = False
        self._over: asyncio.Future[None] | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._over = over = loop.create_future()
        client, server = self.sockets
        for sock in self.sockets:
            sock.setblocking(True)
        ways = [("up", client, server), ("down", server, client)]
        for started, (way, src, dst) in enumerate(ways):
            try:
                _workers.run(f"{self.name}:{way}", functools.partial(self._way, src, dst, loop))
            except RuntimeError:  # no thread to be had: end what started
                self.abort()
                for _ in range(len(ways) - started):
                    self._way_done(loop)
                raise
        try:
            await asyncio.shield(over)
        except asyncio.CancelledError:
            self.abort()  # the threads close everything once out of their splice
            raise

    def abort(self) -> None:
        with self._lock:
            if self._closed:
                return
            for sock in self.sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # not connected any more

    def _way(self, src: socket.socket, dst: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        """One way, until EOF (passed on as a half-close) or an error (ending both)."""
        try:
            _splice(src, dst)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            self.abort()
        finally:
            self._way_done(loop)

    def _way_done(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._left -= 1
            if self._left:
                return
            self._closed = True
            for sock in self.sockets:
                sock.close()
        try:
            loop.call_soon_threadsafe(self._finish)
        except RuntimeError:
            pass  # the loop is closed: no one waits any more

    def _finish(self) -> None:
        if self._over is not None and not self._over.done():
            self._over.set_result(None)


def _splice(src: socket.socket, dst: socket.socket) -> None:
    """What ``src`` sends, to ``dst`` through a pipe of this way's own, until its EOF."""
    read, write = os.pipe2(os.O_CLOEXEC)
    moved, big, asked = 0, False, False
    try:  # a splice moves at most what the pipe holds: ask for the most it could
        while n := os.splice(src.fileno(), write, BIG_PIPE):
            moved += n
            while n:
                n -= os.splice(read, dst.fileno(), n)
            if moved > GROW_AFTER and not asked:  # the pipe is empty here: it may resize
                asked = True
                big = _big_pipes.acquire(blocking=False) and _grow(write)
    finally:
        os.close(read)
        os.close(write)
        if big:
            _big_pipes.release()


def _grow(pipe: int) -> bool:
    """Whether ``pipe`` is now ``BIG_PIPE`` bytes (one of ``BIG_PIPES``, already taken)."""
    try:
        fcntl.fcntl(pipe, F_SETPIPE_SZ, BIG_PIPE)
    except OSError:  # past the user's allowance: its size now still works
        _big_pipes.release()
        return False
    return True


class _End(asyncio.BufferedProtocol):
    """One end of a ``StreamRelay``: what it receives goes to its peer as it comes, once the
    relay has started (both ends made); before, its first read is kept, and it pauses."""

    def __init__(self, relay: StreamRelay) -> None:
        self.relay = relay
        self.peer: _End | None = None
        self.transport: asyncio.Transport | None = None
        self.ended = False  # its far side sent EOF
        self.held = False  # its peer has more to send than it should hold: not read now
        self.buffer = memoryview(bytearray(BUFFER))
        #: What it read before the relay started: written to its peer first, in order.
        self.early: list[bytes] = []

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        # A copy: a transport may keep what it could not send yet by reference (Python
        # 3.12's write buffer does), and this buffer is read into again.
        data = bytes(self.buffer[:nbytes])
        peer = self.peer
        if self.relay.flowing and peer is not None and peer.transport is not None:
            peer.transport.write(data)
            return
        # Not started: its peer's transport may be made already, but the other way's early
        # reads are not written yet, nor this end's (``StreamRelay.run`` writes them all).
        self.early.append(data)
        if self.transport is not None:
            self.transport.pause_reading()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not paused here, but at its first read (``buffer_updated``): a ``pause_reading``
        # in ``connection_made`` does not hold on Python 3.11.2 (the transport starts
        # reading anyway, CPython gh-103607) and leaves it taking itself for paused, so
        # that the next ``pause_reading`` does nothing either.
        self.transport = cast(asyncio.Transport, transport)

    def eof_received(self) -> bool:
        self.ended = True
        peer = self.peer
        if not self.relay.flowing:
            return True  # passed on once the relay starts, after what came before it
        if peer is None or peer.transport is None or peer.transport.is_closing() or peer.ended:
            self.relay.close()
            return False
        if peer.transport.can_write_eof():
            peer.transport.write_eof()  # half-closed: the other way may still be talking
            return True
        return False

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.held = True
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.held = False
            if self.relay.flowing:
                self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.lost()


class StreamRelay:
    """Both ways of a connection in the event loop (see the module's docstring)."""

    def __init__(self, client: socket.socket, server: socket.socket, *, name: str) -> None:
        self.name = name
        self.sockets = (client, server)
        self.ends = (_End(self), _End(self))
        self.ends[0].peer, self.ends[1].peer = self.ends[1], self.ends[0]
        self.flowing = False  # both ends made, and what they read before written on
        self._lost = 0
        self._over: asyncio.Future[None] | None = None
        self._aborted = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._over = over = loop.create_future()
        (client, server), (client_end, server_end) = self.sockets, self.ends
        try:
            await loop.connect_accepted_socket(lambda: client_end, sock=client)
            await loop.create_connection(lambda: server_end, sock=server)
            if self._aborted:
                self.close(abort=True)
            self._start()
            await asyncio.shield(over)
        except BaseException:
            self.abort()
            for end, sock in zip(self.ends, self.sockets, strict=True):
                if end.transport is None:
                    sock.close()  # never handed to a transport
            raise

    def _start(self) -> None:
        """Both ends are made: what each read before goes on (then its EOF), and both read
        from now on, each unless its peer has too much to send (flow control)."""
        for end in self.ends:
            peer = end.peer
            if peer is None or peer.transport is None or peer.transport.is_closing():
                continue
            for data in end.early:
                peer.transport.write(data)
            end.early.clear()
            if end.ended and peer.transport.can_write_eof():
                peer.transport.write_eof()
        self.flowing = True
        if all(end.ended for end in self.ends):
            self.close()  # both ways were over before it started
            return
        for end in self.ends:
            if end.transport is not None and not end.transport.is_closing() and not end.held:
                end.transport.resume_reading()

    def abort(self) -> None:
        self._aborted = True
        self.close(abort=True)

    def close(self, *, abort: bool = False) -> None:
        """Close both ends (each once what it has to send is sent, unless ``abort``)."""
        for end in self.ends:
            if end.transport is not None:
                if abort:
                    end.transport.abort()
                else:
                    end.transport.close()

    def lost(self) -> None:
        self._lost += 1
        self.close()
        if self._lost == 2 and self._over is not None and not self._over.done():
            self._over.set_result(None)


Relay = SpliceRelay | StreamRelay


def make_relay(
    client: socket.socket, server: socket.socket, *, name: str, splice: bool = SPLICE
) -> Relay:
    """The relay for a connection the proxy has allowed: it owns both sockets from here."""
    if splice:
        return SpliceRelay(client, server, name=name)
    return StreamRelay(client, server, name=name)
