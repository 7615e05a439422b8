"""Watching bd's data: a change under ``.beads/`` means ``bd ready`` may say something new.

watchfiles (inotify on Linux, FSEvents on macOS) reports a write within a few milliseconds,
where polling ``bd ready`` costs a process per second and still lags. Files bd or its database
touch without changing issues (logs, locks, sockets, pid files) are ignored, so gridd's own
``bd ready`` does not wake itself. The slow poll stays as the safety net for filesystems
that report nothing (network mounts) and for a watch that cannot start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gridd.events import EventBus

if TYPE_CHECKING:
    from watchfiles import Change

log = logging.getLogger(__name__)

#: Suffixes and names under .beads/ that never carry issue data.
_NOISE_SUFFIXES = (".log", ".lock", ".sock", ".pid", ".tmp", "~", ".swp")
_NOISE_NAMES = frozenset({"LOCK", "last-touched", ".gitignore"})
#: How long the watcher waits for a burst of writes to settle before reporting it.
STEP_MS = 10


def is_issue_data(path: str) -> bool:
    """False for files bd touches without changing issues (so they never wake a sync)."""
    name = Path(path).name
    return name not in _NOISE_NAMES and not name.endswith(_NOISE_SUFFIXES)


def is_own_echo(now: float, *, writing: int, wrote_at: float | None, window: float) -> bool:
    """Whether a change is probably gridd's own bd write showing up: one runs now, or one
    ended less than ``window`` seconds ago. (Only how soon the change is read depends on
    it: a change taken for an echo is still read, after the pause between reads.)"""
    return writing > 0 or (wrote_at is not None and now - wrote_at < window)


def _filter(change: Change, path: str) -> bool:
    return is_issue_data(path)


async def watch_beads(
    directory: Path, on_change: Callable[[], None], *, bus: EventBus, retry_seconds: float = 30.0
) -> None:
    """Call ``on_change`` after each settled burst of changes under ``directory``, forever."""
    # Imported here: a daemon without beads never pays for the watcher.
    from watchfiles import awatch

    while True:
        try:
            async for _changes in awatch(
                directory, watch_filter=_filter, step=STEP_MS, debounce=200, recursive=True
            ):
                on_change()
        except (OSError, RuntimeError) as exc:
            # The directory vanished or the OS refused a watch (inotify limits): the poll
            # carries on; try again later.
            log.warning("cannot watch %s (%s); the poll continues", directory, exc)
            bus.publish(
                "beads.warning",
                {"warning": f"cannot watch {directory}: {exc}", "retryInSeconds": retry_seconds},
            )
        await asyncio.sleep(retry_seconds)
