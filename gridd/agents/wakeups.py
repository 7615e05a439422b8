"""Wake-ups for agent watchers: a watcher sleeps until its agent wrote, exited or was lost.

A watcher (``pool.watching.Watcher``) used to look at its run every 20-50 ms whether or not
anything had happened; with a few hundred agents that polling was most of the daemon's CPU.
Now it waits on its ``Wakeup``, which three sources set:

- **file notifications**: one inotify instance (``asyncinotify``) for the daemon, a watch on
  each run directory, read by a reader callback on the event loop (no task, no timer). Only
  the run's own files count (``output.log``, ``heartbeat.ndjson``, ``exit.json``, which the
  shim renames into place): ``chunks.idx`` is the daemon's own writing and would wake it
  for nothing.
- **the shim's death**: a pidfd (Linux) becomes readable when the shim exits, even when it
  was killed before writing ``exit.json``.
- **the safety net**: one sweep every ``sweep_seconds`` asks every run whether it holds
  unread data (two ``stat`` calls) and wakes only those that do. Notifications that were
  lost (queue overflow) or never existed are found there. Where inotify is unavailable
  (macOS) or switched off (``watch.notify = false``) the sweep runs every
  ``fallback_seconds`` instead and is the only source.

Each ``Wakeup`` counts its wake-ups and where they came from (``counts``), so tests and
benchmarks can see that a quiet daemon's watchers stay asleep.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The files in a run directory whose change means the watcher has something to read.
RUN_FILES = frozenset({"output.log", "heartbeat.ndjson", "exit.json"})


@dataclass
class WakeCounts:
    """Why a watcher woke: a file notice, the safety-net sweep, its shim's exit, a timeout."""

    notices: int = 0
    swept: int = 0
    shim_exit: int = 0
    timeouts: int = 0
    wakeups: int = 0  # times ``wait`` returned


@dataclass
class Wakeup:
    """One run's wake-up flag. ``unread`` (set by the watcher) says whether the run holds
    data the watcher has not read yet; the sweep asks it."""

    run_dir: Path
    unread: Callable[[], bool]
    counts: WakeCounts = field(default_factory=WakeCounts)
    shim_gone: bool = False
    _event: asyncio.Event = field(default_factory=asyncio.Event)
    _watch: Any = None  # asyncinotify.Watch
    _pidfd: int | None = None

    @property
    def shim_watched(self) -> bool:
        """True when the shim's exit wakes us (a pidfd): no need to ask the OS on a timer."""
        return self._pidfd is not None

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        """Called before looking at the run: anything written after this wakes us again."""
        self._event.clear()

    async def wait(self, timeout: float | None) -> None:
        """Sleep until something happens to the run, or ``timeout`` seconds."""
        if not self._event.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                self.counts.timeouts += 1
        self.counts.wakeups += 1


class Wakeups:
    """Where every watched run's ``Wakeup`` comes from (one per daemon)."""

    def __init__(
        self, *, notify: bool = True, sweep_seconds: float = 2.0, fallback_seconds: float = 0.05
    ) -> None:
        self.notify = notify
        self.sweep_seconds = sweep_seconds
        self.fallback_seconds = fallback_seconds
        self.runs: dict[Path, Wakeup] = {}
        self.sweeps = 0
        self.overflows = 0
        self._inotify: Any = None  # asyncinotify.Inotify, when available
        self._by_wd: dict[int, Wakeup] = {}
        #: Counts of runs no longer watched, so ``totals`` covers the daemon's whole life.
        self._retired = WakeCounts()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- set-up ----------------------------------------------------------------------------

    def start(self) -> None:
        """Open the inotify instance (when wanted and possible) on the running loop."""
        self._loop = asyncio.get_running_loop()
        if not self.notify or self._inotify is not None:
            return
        try:
            from asyncinotify import InitFlags, Inotify
        except (ImportError, OSError, AttributeError) as exc:  # not Linux: the sweep polls
            log.info(
                "no inotify (%s): agent output is polled every %ss", exc, self.fallback_seconds
            )
            return
        try:
            inotify = Inotify(flags=InitFlags.CLOEXEC, cache_size=256)
        except OSError as exc:  # e.g. fs.inotify.max_user_instances reached
            log.warning("inotify unavailable (%s): agent output is polled instead", exc)
            return
        # Non-blocking by hand: asyncinotify 4.4's InitFlags.NONBLOCK has O_CLOEXEC's value,
        # and a blocking read in the reader callback would freeze the whole daemon.
        os.set_blocking(inotify.fd, False)
        self._inotify = inotify
        self._loop.add_reader(inotify.fd, self._drain)

    @property
    def interval(self) -> float:
        """Seconds between sweeps: slow with notifications, fast as the only source."""
        return self.sweep_seconds if self._inotify is not None else self.fallback_seconds

    @property
    def notifying(self) -> bool:
        return self._inotify is not None

    def close(self) -> None:
        for wake in list(self.runs.values()):
            self.unwatch(wake)
        if self._inotify is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None

    # -- runs ------------------------------------------------------------------------------

    def watch(
        self,
        run_dir: Path,
        *,
        unread: Callable[[], bool],
        shim_pid: int | None = None,
        shim_alive: Callable[[], bool] | None = None,
    ) -> Wakeup:
        """Start waking for ``run_dir``. Set at once: the first look finds what is there.

        ``shim_pid`` with ``shim_alive`` (its identity check, asked once the pid is pinned
        by a pidfd): the shim's exit wakes the watcher too."""
        wake = Wakeup(run_dir, unread)
        wake.set()
        if self._inotify is not None:
            from asyncinotify import Mask

            mask = Mask.MODIFY | Mask.MOVED_TO | Mask.CREATE | Mask.ONLYDIR
            try:
                watch = self._inotify.add_watch(run_dir, mask)
            except OSError as exc:  # e.g. max_user_watches: this run falls back to the sweep
                log.warning(
                    "cannot watch %s (%s); polling it every %ss", run_dir, exc, self.sweep_seconds
                )
            else:
                wake._watch = watch
                self._by_wd[watch.wd] = wake
        if shim_pid is not None and self._loop is not None:
            self._watch_shim(wake, shim_pid, shim_alive)
        self.runs[run_dir] = wake
        return wake

    def unwatch(self, wake: Wakeup) -> None:
        if self.runs.get(wake.run_dir) is wake:
            del self.runs[wake.run_dir]
            _add(self._retired, wake.counts)
        self.forget_notifications(wake)
        self._close_pidfd(wake)

    def forget_notifications(self, wake: Wakeup) -> None:
        """Stop file notifications for one run; the sweep alone looks after it from now
        on (as after a failed ``add_watch``). Tests use it to lose notifications."""
        watch, wake._watch = wake._watch, None
        if watch is not None:
            self._by_wd.pop(watch.wd, None)
            if self._inotify is not None:
                try:
                    self._inotify.rm_watch(watch)
                except OSError:
                    pass  # the directory is gone: the kernel dropped the watch already

    def _watch_shim(self, wake: Wakeup, pid: int, alive: Callable[[], bool] | None) -> None:
        opener = getattr(os, "pidfd_open", None)
        if opener is None:
            return  # not Linux: the watcher asks the OS on a timer
        try:
            fd = opener(pid)
        except ProcessLookupError:
            wake.shim_gone = True
            return
        except OSError:
            return
        if alive is not None and not alive():
            os.close(fd)  # the number belongs to another process now: ours is gone
            wake.shim_gone = True
            return
        wake._pidfd = fd
        assert self._loop is not None

        def exited() -> None:
            self._close_pidfd(wake)
            wake.shim_gone = True
            wake.counts.shim_exit += 1
            wake.set()

        self._loop.add_reader(fd, exited)

    def _close_pidfd(self, wake: Wakeup) -> None:
        fd, wake._pidfd = wake._pidfd, None
        if fd is not None:
            if self._loop is not None:
                self._loop.remove_reader(fd)
            os.close(fd)

    # -- the sources ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """Read every queued notification and wake the runs they name (once per batch)."""
        from asyncinotify import Mask

        assert self._inotify is not None
        woken: set[int] = set()
        while True:
            try:
                event = self._inotify.sync_get()
            except BlockingIOError:
                break
            except OSError as exc:
                log.warning("reading inotify failed: %s", exc)
                break
            if event is None:
                break
            if Mask.Q_OVERFLOW in event.mask:
                # Notifications were lost: every run may hold unread data.
                self.overflows += 1
                for every in self.runs.values():
                    every.counts.swept += 1
                    every.set()
                continue
            watch = event.watch
            wd = watch.wd if watch is not None else None
            if Mask.IGNORED in event.mask:
                if wd is not None:
                    self._by_wd.pop(wd, None)  # the directory went away
                continue
            if event.name is None or str(event.name) not in RUN_FILES:
                continue
            if wd is None or wd in woken:
                continue
            found = self._by_wd.get(wd)
            if found is not None:
                woken.add(wd)
                found.counts.notices += 1
                found.set()

    def sweep(self) -> int:
        """The safety net: wake every run holding unread data. Returns how many woke."""
        self.sweeps += 1
        woken = 0
        for wake in list(self.runs.values()):
            if wake._event.is_set():
                continue
            try:
                due = wake.unread()
            except OSError:
                due = True  # let the watcher see (and report) what is wrong
            if due:
                wake.counts.swept += 1
                wake.set()
                woken += 1
        return woken

    async def run(self) -> None:
        """The sweep loop (a background task of the pool)."""
        while True:
            await asyncio.sleep(self.interval)
            self.sweep()

    def totals(self) -> WakeCounts:
        """The sum of every watched run's counts (for tests, benchmarks and logs)."""
        total = WakeCounts()
        _add(total, self._retired)
        for wake in self.runs.values():
            _add(total, wake.counts)
        return total


def _add(total: WakeCounts, more: WakeCounts) -> None:
    total.notices += more.notices
    total.swept += more.swept
    total.shim_exit += more.shim_exit
    total.timeouts += more.timeouts
    total.wakeups += more.wakeups
