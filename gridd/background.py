"""Background tasks: started through one helper that names them, logs their death and
awaits them at shutdown, so nothing runs unobserved and nothing is left pending.

Long-lived parts (the scheduler, monitors, pollers) go through :meth:`Background.supervise`
instead of :meth:`Background.spawn`: the :class:`~gridd.supervisor.Supervisor` restarts
them when they crash and reports them on ``/health``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from gridd.settings import SupervisorSettings
from gridd.supervisor import Announce, Factory, Supervisor

log = logging.getLogger(__name__)


class Background:
    def __init__(
        self, supervision: SupervisorSettings | None = None, *, announce: Announce | None = None
    ) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.supervisor = Supervisor(self, supervision, announce=announce)

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def supervise(self, name: str, factory: Factory, *, core: bool = False) -> asyncio.Task[Any]:
        """Run the long-lived part ``name`` (``factory()`` again each time it crashes)."""
        return self.supervisor.supervise(name, factory, core=core)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("background task %s died: %r", task.get_name(), exc, exc_info=exc)

    @property
    def names(self) -> list[str]:
        return sorted(t.get_name() for t in self._tasks)

    async def stop(self, timeout: float = 5.0) -> None:
        self.supervisor.stop()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
