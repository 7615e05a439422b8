"""The Grid service: the one object the API talks to.

It owns the store, the event bus and the background work, builds the ``RepoState`` view and
records intent. The API never touches processes directly (intent goes through state).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import time
from collections.abc import Callable

from gridd import API_VERSION, __version__
from gridd.background import Background
from gridd.events import EventBus
from gridd.model import (
    DaemonInfo,
    Health,
    RepoState,
    SessionState,
    Stats,
    VersionInfo,
    utcnow,
)
from gridd.settings import Settings
from gridd.store import Store
from gridd.workspace import Workspace

log = logging.getLogger(__name__)


class Grid:
    def __init__(self, *, workspace: Workspace, settings: Settings, store: Store) -> None:
        self.workspace = workspace
        self.settings = settings
        self.store = store
        self.bus = EventBus(store, queue_size=settings.events.subscriber_queue)
        self.background = Background()
        self.started_at = utcnow()
        self._started_mono = time.monotonic()
        self.warnings: list[str] = []
        self._shutdown_callback: Callable[[], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        report = self.store.report
        if report.quarantined:
            moved = ", ".join(str(p) for p in report.quarantined)
            warning = f"state database was unreadable ({report.reason}); moved aside to {moved}"
            self.warnings.append(warning)
            self.bus.publish(
                "daemon.store_quarantined",
                {"reason": report.reason, "movedTo": [str(p) for p in report.quarantined]},
            )
        self.bus.publish("daemon.started", {"pid": os.getpid(), "version": __version__})
        self.background.spawn("event-log-pruner", self._prune_loop())

    async def stop(self) -> None:
        """End live streams and background work; the caller closes the store afterwards."""
        if not self.bus.closed:
            self.bus.publish("daemon.stopping", {"pid": os.getpid()})
            self.bus.close()
        await self.background.stop()

    def on_shutdown_request(self, callback: Callable[[], None]) -> None:
        self._shutdown_callback = callback

    def request_shutdown(self) -> None:
        # Close the streams first: open SSE responses would otherwise hold the server open.
        if not self.bus.closed:
            self.bus.publish("daemon.stopping", {"pid": os.getpid()})
            self.bus.close()
        if self._shutdown_callback is not None:
            self._shutdown_callback()

    async def _prune_loop(self) -> None:
        while True:
            removed = self.store.prune_events(self.settings.events.retain)
            if removed:
                log.info("pruned %d old events", removed)
            await asyncio.sleep(60)

    # -- views ---------------------------------------------------------------------------

    @property
    def uptime(self) -> float:
        return round(time.monotonic() - self._started_mono, 3)

    def health(self) -> Health:
        return Health(
            status="degraded" if self.warnings else "ok", pid=os.getpid(), uptime=self.uptime
        )

    def version(self) -> VersionInfo:
        return VersionInfo(
            version=__version__,
            api_version=API_VERSION,
            pid=os.getpid(),
            python=platform.python_version(),
        )

    def daemon_info(self) -> DaemonInfo:
        return DaemonInfo(
            version=__version__,
            api_version=API_VERSION,
            pid=os.getpid(),
            uptime=self.uptime,
            workspace=str(self.workspace.root),
            started_at=self.started_at,
            last_event_id=self.bus.last_id,
            subscribers=self.bus.subscriber_count,
            warnings=list(self.warnings),
        )

    def state(self) -> RepoState:
        return RepoState(
            session=SessionState(),
            tasks=[],
            agents=[],
            pending_questions=[],
            stats=Stats(),
            daemon=self.daemon_info(),
        )
