"""The disk under ``.grid/`` refusing writes: noticed, reported, waited out, never spent.

A full disk (``ENOSPC``, ``EDQUOT``) or one that is read-only (``EROFS``, or a ``.grid/``
the daemon may not write) is nobody's task failing. The first write that fails for it (a
run directory, a worktree, a store write) marks the fault (``DiskFault.note``). While it
lasts, ``/health`` is degraded naming it, the scheduler starts nothing (each start would
only fail again and use up an attempt) and a start that met it is put back uncounted. A
probe runs every second (``DiskFault.watch``): once ``.grid/`` takes a small synced write
with ``PROBE_MARGIN_BYTES`` free, the fault clears and work resumes by itself.

A failure that names the disk only in words (git's "...: Read-only file system") counts by
its words; one that does not name it at all is checked with the same probe at once, so a
start is not counted against a task on a guess either way.

``refusal`` is the same probe for a daemon about to start: on a full or read-only disk it
says so in one line instead of starting into errors.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

from gridd.errors import DISK_CODES, GriddError, StoreError

log = logging.getLogger(__name__)

#: The name ``/health`` and the ``daemon.degraded`` event give a ``.grid/`` refusing writes.
DISK_PART = "disk"
#: Free bytes ``.grid/`` must have before a disk that was full is called writable again.
PROBE_MARGIN_BYTES = 1024 * 1024
#: What a write of this many bytes (synced) must get through for the probe to pass.
PROBE_BYTES = 4096
#: The probe's file, beside the state database (written, synced and removed each time).
PROBE_NAME = ".write-probe"

#: The errors of a disk that refuses writes, and how each is said.
_REFUSALS = {
    errno.ENOSPC: "is full",
    errno.EDQUOT: "is over its quota",
    errno.EROFS: "is read-only",
}
#: Said of a ``.grid/`` this process may not write (only ever found by the probe: a
#: permission error from elsewhere may well be the task's own business).
_NOT_WRITABLE = (errno.EACCES, errno.EPERM)


def refused(exc: BaseException | None) -> int | None:
    """The errno of a disk refusing writes found in ``exc`` or what caused it, else None.
    A ``StoreError`` with a disk code counts (SQLite does not keep the errno), and so does
    a ``GriddError`` quoting the system's words for one (git's stderr, say)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _REFUSALS:
            return exc.errno
        if isinstance(exc, StoreError) and exc.code in DISK_CODES:
            return errno.ENOSPC if exc.code == "disk_full" else errno.EROFS
        if isinstance(exc, GriddError):
            quoted = next((n for n in _REFUSALS if os.strerror(n) in exc.message), None)
            if quoted is not None:
                return quoted
        exc = exc.__cause__ or exc.__context__
    return None


def probe(grid_dir: Path, *, margin: int = PROBE_MARGIN_BYTES) -> str | None:
    """Why ``grid_dir`` does not take writes now, as a sentence; None when it does."""
    where = f"the disk holding {grid_dir}"
    try:
        fs = os.statvfs(grid_dir)
    except OSError as exc:
        return f"{grid_dir} cannot be examined ({exc.strerror})"
    if fs.f_flag & os.ST_RDONLY:
        return f"{where} {_REFUSALS[errno.EROFS]}"
    free = fs.f_bavail * fs.f_frsize
    if free < margin:
        return f"{where} {_REFUSALS[errno.ENOSPC]} ({free} bytes free)"
    path = grid_dir / PROBE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(path)
    except OSError as exc:
        if exc.errno in _REFUSALS:
            return f"{where} {_REFUSALS[exc.errno]}"
        if exc.errno in _NOT_WRITABLE:
            return f"{grid_dir} is not writable ({exc.strerror})"
        return None  # not the disk's doing (a leftover directory in the way, say)
    return None


def refusal(grid_dir: Path) -> str | None:
    """Why a daemon cannot start in ``grid_dir``: its disk is full or read-only."""
    why = probe(grid_dir)
    if why is None:
        return None
    return f"cannot start: {why}; free some space (or make it writable) and start again"


class DiskFault:
    """Whether ``.grid/`` takes writes, as the daemon last found out."""

    def __init__(
        self,
        grid_dir: Path,
        *,
        announce: Callable[[str, dict[str, object]], None] = lambda kind, data: None,
    ) -> None:
        self.grid_dir = grid_dir
        #: Why writes are refused, or None while they are taken.
        self.reason: str | None = None
        self._announce = announce
        self._cleared: list[Callable[[], None]] = []

    def on_clear(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever the fault clears (the scheduler wakes to start again)."""
        self._cleared.append(callback)

    def note(self, exc: BaseException | None) -> str | None:
        """A write failed with ``exc``: if the disk refused it (named by the error, or
        confirmed by a probe now), the fault is on. Returns its reason, or None when the
        failure is not the disk's."""
        if self.reason is not None:
            return self.reason
        code = refused(exc)
        why = f"the disk holding {self.grid_dir} {_REFUSALS[code]}" if code else None
        why = why or probe(self.grid_dir, margin=0)
        if why is not None:
            self._set(why)
        return why

    def _set(self, why: str) -> None:
        self.reason = why
        log.error("%s: starts are paused until it takes writes again", why)
        self._announce(
            "daemon.degraded", {"part": DISK_PART, "state": "down", "core": False, "error": why}
        )

    def recheck(self) -> None:
        """Probe a disk that refused writes; clear the fault once it takes them again."""
        if self.reason is None:
            return
        why = probe(self.grid_dir)
        if why is not None:
            self.reason = why
            return
        self.reason = None
        log.warning("%s takes writes again: starts resume", self.grid_dir)
        self._announce("daemon.recovered", {"part": DISK_PART})
        for callback in self._cleared:
            callback()
