"""Crash points: a test seam that kills the daemon at a named step, the hard way.

``daemon.crash_points`` in the configuration names the steps; reaching one sends the
daemon SIGKILL (no cleanup, no flush: exactly what a power cut or ``kill -9`` does there).
Tests use it to prove that what was recorded before the step is carried out after a
restart. The list is empty by default and nothing else reads it.

Points: ``intent.recorded`` (a stop, kill, cancel or approval is persisted, not yet acted
on); ``spawn.recorded`` (an agent is recorded, its process not yet started);
``spawn.private_repo`` (a sandboxed run's own repository is made in its worktree, its
process not yet started); ``spawn.started`` (its process runs, its pid not yet recorded);
``finish.reclaimed`` (an ended sandboxed run's commits are on its task's branch, its own
repository gone, nothing else of its finish done).
"""

from __future__ import annotations

import logging
import os
import signal

from gridd.settings import Settings

log = logging.getLogger(__name__)


def crash_point(settings: Settings, name: str) -> None:
    if name in settings.daemon.crash_points:
        log.critical("crash point %s reached: killing the daemon (daemon.crash_points)", name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
