"""The supervisor: every long-lived background part runs under it, and comes back when it dies.

A *part* is one named loop the daemon needs for as long as it runs: the scheduler, the
store watch, the agent wake-up sweep, the notifier, the beads poller and watch, the
conflict radar, the merge queue, the event-log pruner. Per-agent tasks (``agent:<id>``,
``start:<id>``...) are not parts: they end when their agent does.

When a part raises, the supervisor marks it ``restarting``, announces ``daemon.degraded``
naming it, waits a backoff (doubling per recent crash, capped) and runs it again from a
fresh coroutine; once it is running again it is ``up`` and ``daemon.recovered`` is
announced. A part that crashes ``flap_max`` times within ``flap_window_seconds`` is
``down``: it is tried again only after ``down_retry_seconds`` (circus' flapping guard).
A part that returns normally has finished its work and is no longer listed.

The decision (:func:`after_crash`) is a pure function; ``/health`` reads :meth:`states` and
:meth:`core_down`, ``/metrics`` reads :meth:`states`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from gridd.settings import SupervisorSettings

log = logging.getLogger(__name__)

Factory = Callable[[], Coroutine[Any, Any, Any]]
Announce = Callable[[str, dict[str, Any]], None]


class Spawner(Protocol):
    """Starts a named task and awaits it at shutdown: ``gridd.background.Background``,
    which owns the supervisor (so the supervisor does not import it back)."""

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...


class PartState(enum.StrEnum):
    UP = "up"
    RESTARTING = "restarting"
    DOWN = "down"


@dataclass(frozen=True)
class Verdict:
    """What to do with a part that just crashed: its state while waiting, and for how long."""

    state: PartState
    delay: float


def after_crash(crashes: list[float], now: float, settings: SupervisorSettings) -> Verdict:
    """Decide a crashed part's fate from the monotonic times of its recent crashes
    (``crashes`` includes this one)."""
    recent = [t for t in crashes if now - t <= settings.flap_window_seconds]
    if len(recent) >= settings.flap_max:
        return Verdict(PartState.DOWN, settings.down_retry_seconds)
    delay = settings.backoff_seconds * 2 ** max(0, len(recent) - 1)
    return Verdict(PartState.RESTARTING, min(delay, settings.backoff_max_seconds))


@dataclass
class Part:
    name: str
    factory: Factory
    core: bool
    state: PartState = PartState.UP
    restarts: int = 0
    last_error: str | None = None
    crashes: list[float] = field(default_factory=list)
    #: Set to cut a backoff short (``Supervisor.retry_now``).
    poke: asyncio.Event = field(default_factory=asyncio.Event)


class Supervisor:
    """Runs parts through the daemon's ``Background`` (so each is named and awaited at
    shutdown) and restarts them when they crash."""

    def __init__(
        self,
        background: Spawner,
        settings: SupervisorSettings | None = None,
        *,
        announce: Announce | None = None,
    ) -> None:
        self._background = background
        self.settings = settings or SupervisorSettings()
        self.parts: dict[str, Part] = {}
        #: Told of ``daemon.degraded`` / ``daemon.recovered`` (published on the bus).
        self.announce = announce
        self._stopping = False
        #: Bumped whenever a part comes, goes or changes state: the views below are cached
        #: by it, since /health reads them on every request.
        self.revision = 0
        self._views: tuple[int, dict[str, str], list[str], list[str]] | None = None

    def supervise(self, name: str, factory: Factory, *, core: bool = False) -> asyncio.Task[Any]:
        """Run ``factory()`` as the part ``name``, again from a new call whenever it dies."""
        part = Part(name=name, factory=factory, core=core)
        self.parts[name] = part
        self.revision += 1
        return self._background.spawn(name, self._run(part))

    def _view(self) -> tuple[int, dict[str, str], list[str], list[str]]:
        if self._views is None or self._views[0] != self.revision:
            parts = sorted(self.parts.items())
            self._views = (
                self.revision,
                {name: part.state.value for name, part in parts},
                [n for n, p in parts if p.state is not PartState.UP],
                [n for n, p in parts if p.core and p.state is not PartState.UP],
            )
        return self._views

    def states(self) -> dict[str, str]:
        """Part name -> "up" | "restarting" | "down" (what /health and /metrics show)."""
        return dict(self._view()[1])

    def degraded(self) -> list[str]:
        """The parts that are not up, by name."""
        return list(self._view()[2])

    def core_down(self) -> list[str]:
        """The core parts that are not up: the daemon cannot do its job without them."""
        return list(self._view()[3])

    def retry_now(self) -> None:
        """Cut every waiting backoff short: what they crashed on is known to be fixed
        (the store takes writes again), so nothing waits out ``down_retry_seconds``."""
        for part in self.parts.values():
            if part.state is not PartState.UP:
                part.poke.set()

    def stop(self) -> None:
        """Shutdown is under way: a part that ends now is not restarted."""
        self._stopping = True

    async def _run(self, part: Part) -> None:
        try:
            while True:
                try:
                    await part.factory()
                    return  # finished its work: not a crash
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if self._stopping:
                        raise
                    await self._crashed(part, exc)
        finally:
            if self.parts.get(part.name) is part:
                del self.parts[part.name]
                self.revision += 1

    async def _crashed(self, part: Part, exc: Exception) -> None:
        now = time.monotonic()
        part.crashes = [t for t in part.crashes if now - t <= self.settings.flap_window_seconds]
        part.crashes.append(now)
        verdict = after_crash(part.crashes, now, self.settings)
        part.state = verdict.state
        self.revision += 1
        part.last_error = f"{type(exc).__name__}: {exc}"
        log.error(
            "background part %s crashed (%s); %s, next try in %.2fs",
            part.name,
            part.last_error,
            verdict.state.value,
            verdict.delay,
            exc_info=exc,
        )
        self._tell(
            "daemon.degraded",
            {
                "part": part.name,
                "state": verdict.state.value,
                "core": part.core,
                "error": part.last_error,
                "retryInSeconds": round(verdict.delay, 3),
            },
        )
        part.poke.clear()
        try:
            await asyncio.wait_for(part.poke.wait(), verdict.delay)
        except TimeoutError:
            pass
        part.restarts += 1
        part.state = PartState.UP
        self.revision += 1
        self._tell("daemon.recovered", {"part": part.name, "restarts": part.restarts})

    def announce_safely(self, kind: str, data: dict[str, Any]) -> None:
        """Publish ``kind`` through ``announce``; a failure (a full disk) is only logged."""
        self._tell(kind, data)

    def _tell(self, kind: str, data: dict[str, Any]) -> None:
        if self.announce is None:
            return
        try:
            self.announce(kind, data)
        except Exception as exc:  # a full disk must not also stop the restart
            log.error("could not publish %s for %s: %r", kind, data.get("part"), exc)
