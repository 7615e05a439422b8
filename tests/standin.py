"""What the loopback stand-ins of the providers' APIs share (``anthropic_standin.py``,
``openai_standin.py``, ``gemini_standin.py``): a script of answers taken one per turn, every
request recorded, waiting for turns, and an aiohttp app served on 127.0.0.1 from a thread of
its own, so synchronous tests can use it.

A stand-in's handler calls ``take(body, turn=...)``: a side call (a title, a check; the API
decides what is one) is only recorded; a turn takes the next scripted ``Reply``, or None
when the script is empty (the handler answers a plain "Done." then). A reply that ``holds``
answers every turn until it is ``over``: an API that refuses a request refuses a CLI's own
retries of it too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar

from aiohttp import web


@dataclass
class Reply:
    """What every API's scripted answer has: an HTTP status (an error when >= 400) with
    headers, a gate, and whether it answers more than one turn."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    #: Hold the response back until the test releases this event (or 30 s pass).
    gate: threading.Event | None = None
    #: Answer every turn from now on with this one.
    persists: bool = False

    def holds(self) -> bool:
        """It answers more than one turn (until it is ``over``)."""
        return self.persists

    def over(self) -> bool:
        """A reply that ``holds`` is done with (it is skipped from then on)."""
        return False

    def taken(self) -> None:
        """Called under the stand-in's lock each time a turn takes it."""


R = TypeVar("R", bound=Reply)


class ScriptedAPI(Generic[R]):
    """A stand-in's script and records; subclasses serve the API (``app``)."""

    name = "standin"

    def __init__(self) -> None:
        self.script: list[R] = []
        self.requests: list[dict[str, Any]] = []  # every request body, side calls too
        self.answered: list[R] = []  # the replies turns took, each once, in order
        self.url = ""
        self._turns: list[dict[str, Any]] = []
        self._lock = threading.Condition()

    def push(self, *replies: R) -> None:
        with self._lock:
            self.script.extend(replies)

    def turns(self) -> list[dict[str, Any]]:
        """The bodies of the requests that were turns of the conversation."""
        with self._lock:
            return list(self._turns)

    def wait_turns(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self._turns) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the stand-in saw fewer than {count} turns")
                self._lock.wait(left)
            return list(self._turns)

    def take(self, body: dict[str, Any], *, turn: bool = True) -> R | None:
        """Record a request; a turn takes the next reply (None: the script is empty)."""
        with self._lock:
            self.requests.append(body)
            if turn:
                self._turns.append(body)
            self._lock.notify_all()
            if not turn:
                return None
            while self.script and self.script[0].over():
                self.script.pop(0)
            if not self.script:
                return None
            reply = self.script[0] if self.script[0].holds() else self.script.pop(0)
            if not any(reply is seen for seen in self.answered):
                self.answered.append(reply)
            reply.taken()
            return reply

    @staticmethod
    async def held(reply: Reply) -> None:
        """Wait for the reply's gate, if it has one."""
        if reply.gate is not None:
            await asyncio.get_running_loop().run_in_executor(None, reply.gate.wait, 30.0)

    def app(self) -> web.Application:
        raise NotImplementedError

    @contextmanager
    def running(self) -> Iterator[Self]:
        with serve_app(self.app(), name=self.name) as url:
            self.url = url
            yield self

    @classmethod
    @contextmanager
    def serving(cls, *replies: R) -> Iterator[Self]:
        """A new stand-in with ``replies`` scripted, running."""
        server = cls()
        server.push(*replies)
        with server.running():
            yield server


async def not_here(request: web.Request, body: dict[str, Any]) -> web.Response:
    """A 404 with ``body`` for what the stand-in does not serve."""
    await request.read()
    return web.json_response(body, status=404)


@contextmanager
def serve_app(app: web.Application, *, name: str) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) from a thread of its own; yields its URL."""
    started = threading.Event()
    failure: list[BaseException] = []
    url: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []

    def serve() -> None:
        loop = asyncio.new_event_loop()
        loops.append(loop)
        try:
            runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            port = runner.addresses[0][1]
            url.append(f"http://127.0.0.1:{port}")
        except BaseException as exc:  # reported to the starting thread
            failure.append(exc)
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, name=name, daemon=True)
    thread.start()
    started.wait(10)
    if failure:
        raise failure[0]
    try:
        yield url[0]
    finally:
        if loops:
            loops[0].call_soon_threadsafe(loops[0].stop)
        thread.join(10)
