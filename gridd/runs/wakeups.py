"""Wake-ups for agent monitors: a monitor sleeps until its agent wrote, exited or was lost.

A monitor (``pool.monitoring.Monitor``) used to look at its run every 20-50 ms whether or not
anything had happened; with a few hundred agents that polling was most of the daemon's CPU.
Now nothing looks at a run until something happened to it, and what happened decides who
looks:

- **new data** (``output.log`` or ``heartbeat.ndjson`` grew): the run is handed to
  ``on_data``, the pool's output pass (``pool/batching.py``), which reads every such run
  of a moment in one go, one store transaction for all of them;
- **an exit, or a lost shim** (``exit.json`` renamed into place, the shim's pidfd readable,
  a queue overflow): the run's ``Wakeup`` is set with ``exit_due``, waking its monitor,
  which reads ``exit.json`` then and only then.

Three sources report them:

- **file notifications**: one inotify instance (``asyncinotify``) for the daemon, a watch on
  each run directory. Its events are read straight off the descriptor (16 bytes and a name
  each; the library's per-event objects cost more than the rest of the wake-up) and only
  the run's own files count: ``chunks.idx`` is the daemon's own writing. With
  ``coalesce_seconds`` the descriptor is read at most that often: a notice arriving
  later than that after the last batch is read at once, one arriving sooner waits for
  the window to end, together with whatever else arrives meanwhile.
- **the shim's death**: a pidfd (Linux) becomes readable when the shim exits, even when it
  was killed before writing ``exit.json``.
- **the safety net**: one sweep every ``sweep_seconds`` asks every run whether it holds
  unread data (two ``stat`` calls) or an exit record, and reports only those that do.
  Notifications that were lost (queue overflow) or never existed are found there. Where
  inotify is unavailable (macOS) or switched off (``watch.notify = false``) the sweep runs
  every ``fallback_seconds`` instead and is the only source.

Each ``Wakeup`` counts its wake-ups and where they came from (``counts``), so tests and
benchmarks can see that a quiet daemon's monitors stay asleep, and that ``exit.json`` is
read only when something says the run may have ended.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridd.runs import refusals

log = logging.getLogger(__name__)

#: The files in a run directory whose change means there is data to read...
BEATS_FILE = b"heartbeat.ndjson"
#: The shim's record of what the kernel refused the run (``runs/refusals.py``): looked at
#: with the heartbeats.
DENIED_FILE = refusals.DENIED_FILE.encode()
DATA_FILES = frozenset({b"output.log", BEATS_FILE, DENIED_FILE})
#: ... and the one whose arrival means the run may have ended (the shim renames it in).
EXIT_FILE = b"exit.json"
RUN_FILES = frozenset({n.decode() for n in (*DATA_FILES, EXIT_FILE)})

#: ``struct inotify_event``: wd, mask, cookie, len; then ``len`` bytes of NUL-padded name.
_EVENT = struct.Struct("iIII")
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_READ_BYTES = 64 * 1024


@dataclass
class WakeCounts:
    """Why a monitor woke: a file notice, the safety-net sweep, its shim's exit, a timeout;
    how often its run was read (``reads``, by the output pass) and its exit record looked
    for (``exit_checks``)."""

    notices: int = 0
    swept: int = 0
    shim_exit: int = 0
    timeouts: int = 0
    wakeups: int = 0  # times the monitor woke: ``wait`` returned, or the run was read
    reads: int = 0
    exit_checks: int = 0


@dataclass
class Wakeup:
    """One run's wake-up flag. ``unread`` (set by the monitor) says whether the run holds
    data not read yet; ``exit_due`` whether ``exit.json`` is worth reading (it was
    notified, the shim died, the sweep saw it, or the watch just began)."""

    run_dir: Path
    unread: Callable[[], bool]
    key: str = ""  # whose run it is (the agent id), for ``on_data``
    counts: WakeCounts = field(default_factory=WakeCounts)
    shim_gone: bool = False
    exit_due: bool = True
    #: Whether ``heartbeat.ndjson`` (or ``denied.ndjson``) may hold something new: a look
    #: skips them (a ``stat`` of files most agents never write) when only ``output.log``
    #: was notified.
    beats_due: bool = True
    _event: asyncio.Event = field(default_factory=asyncio.Event)
    _watch: Any = None  # asyncinotify.Watch
    _pidfd: int | None = None
    _exit_path: str = ""

    def __post_init__(self) -> None:
        self._exit_path = os.path.join(self.run_dir, "exit.json")

    @property
    def shim_watched(self) -> bool:
        """True when the shim's exit wakes us (a pidfd): no need to ask the OS on a timer."""
        return self._pidfd is not None

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        """Called before looking at the run: anything happening after this wakes us again."""
        self._event.clear()

    def take_exit_due(self) -> bool:
        """Whether to read ``exit.json`` now (counted); clears the flag."""
        due, self.exit_due = self.exit_due or self.shim_gone, False
        if due:
            self.counts.exit_checks += 1
        return due

    async def wait(self, timeout: float | None) -> None:
        """Sleep until something happens to the run, or ``timeout`` seconds."""
        if not self._event.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                self.counts.timeouts += 1
        self.counts.wakeups += 1


def _nothing(wake: Wakeup) -> None:
    """``on_data`` until the pool sets its own: the monitor's own event, as before."""
    wake.set()


class Wakeups:
    """Where every watched run's ``Wakeup`` comes from (one per daemon)."""

    def __init__(
        self,
        *,
        notify: bool = True,
        sweep_seconds: float = 2.0,
        fallback_seconds: float = 0.05,
        coalesce_seconds: float = 0.0,
    ) -> None:
        self.notify = notify
        self.sweep_seconds = sweep_seconds
        self.fallback_seconds = fallback_seconds
        self.coalesce_seconds = coalesce_seconds
        self.runs: dict[Path, Wakeup] = {}
        self.sweeps = 0
        self.overflows = 0
        #: Batches of notifications read (one per window with ``coalesce_seconds``).
        self.drains = 0
        #: Runs with new data go here (the pool's output pass).
        self.on_data: Callable[[Wakeup], None] = _nothing
        self._inotify: Any = None  # asyncinotify.Inotify, when available
        self._by_wd: dict[int, Wakeup] = {}
        #: Counts of runs no longer watched, so ``totals`` covers the daemon's whole life.
        self._retired = WakeCounts()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._window: asyncio.TimerHandle | None = None  # a coalescing window is open
        self._last_drain = float("-inf")  # loop time of the last batch of notifications

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
        self._loop.add_reader(inotify.fd, self._readable)

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
        if self._window is not None:
            self._window.cancel()
            self._window = None
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
        key: str = "",
        shim_pid: int | None = None,
        shim_alive: Callable[[], bool] | None = None,
    ) -> Wakeup:
        """Start waking for ``run_dir``. Set at once (and handed to ``on_data``): the first
        look finds what is there, and whether the run already ended.

        ``shim_pid`` with ``shim_alive`` (its identity check, asked once the pid is pinned
        by a pidfd): the shim's exit wakes the monitor too."""
        wake = Wakeup(run_dir, unread, key)
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
        self.on_data(wake)
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
                # The library forgets a watch when it reads its IN_IGNORED; we read the
                # descriptor ourselves, so we forget it for the library.
                self._inotify._watches.pop(watch.wd, None)

    def _watch_shim(self, wake: Wakeup, pid: int, alive: Callable[[], bool] | None) -> None:
        opener = getattr(os, "pidfd_open", None)
        if opener is None:
            return  # not Linux: the monitor asks the OS on a timer
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

    def _readable(self) -> None:
        """Notifications are waiting: read them now if the last batch was read at least
        ``coalesce_seconds`` ago, else when that much time has passed (the descriptor is
        not watched meanwhile, so a burst costs one loop wake-up). A lone write is read
        at once; many agents writing are read in batches, at most one per window."""
        loop = self._loop
        if self.coalesce_seconds <= 0 or loop is None or self._inotify is None:
            self._drain()
            return
        due = self._last_drain + self.coalesce_seconds
        if loop.time() >= due:
            self._drain()
            return
        loop.remove_reader(self._inotify.fd)
        self._window = loop.call_at(due, self._window_closed)

    def _window_closed(self) -> None:
        self._window = None
        if self._inotify is None or self._loop is None:
            return
        try:
            self._drain()
        finally:
            self._loop.add_reader(self._inotify.fd, self._readable)

    def _drain(self) -> None:
        """Read every queued notification; hand each run with new data to ``on_data`` (once
        per batch) and wake the monitors of runs whose ``exit.json`` arrived."""
        assert self._inotify is not None
        self.drains += 1
        if self._loop is not None:
            self._last_drain = self._loop.time()
        fd, by_wd = self._inotify.fd, self._by_wd
        data: dict[int, Wakeup] = {}
        while True:
            try:
                buf = os.read(fd, _READ_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                log.warning("reading inotify failed: %s", exc)
                break
            if not buf:
                break
            at, end = 0, len(buf)
            while at < end:
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, at)
                name = buf[at + 16 : at + 16 + length].rstrip(b"\0")
                at += 16 + length
                if mask & _IN_Q_OVERFLOW:
                    self._overflowed()
                    continue
                if mask & _IN_IGNORED:
                    by_wd.pop(wd, None)  # the directory went away (or we removed the watch)
                    self._inotify._watches.pop(wd, None)
                    continue
                found = by_wd.get(wd)
                if found is None:
                    continue
                if name in DATA_FILES:
                    data[wd] = found
                    if name in (BEATS_FILE, DENIED_FILE):
                        found.beats_due = True
                elif name == EXIT_FILE:
                    found.exit_due = True
                    found.set()
        for wake in data.values():
            wake.counts.notices += 1
            self.on_data(wake)

    def _overflowed(self) -> None:
        """Notifications were lost: every run may hold unread data, or have ended."""
        self.overflows += 1
        for every in list(self.runs.values()):
            every.counts.swept += 1
            every.exit_due = True
            every.beats_due = True
            every.set()
            self.on_data(every)

    def sweep(self) -> int:
        """The safety net: report every run holding unread data or an exit record.
        Returns how many were reported."""
        self.sweeps += 1
        woken = 0
        for wake in list(self.runs.values()):
            try:
                due = wake.unread()
            except OSError:
                due = True  # let the monitor see (and report) what is wrong
            ended = not wake.exit_due and os.path.exists(wake._exit_path)
            if ended:
                wake.exit_due = True
                wake.set()
            if due:
                wake.beats_due = True  # the sweep does not say which file grew
                self.on_data(wake)
            if due or ended:
                wake.counts.swept += 1
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
    total.reads += more.reads
    total.exit_checks += more.exit_checks
