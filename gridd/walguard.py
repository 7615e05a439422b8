"""The WAL guard: the state database's files as the daemon holds them open, compared with
what their paths name now.

SQLite goes on writing to the files it opened. When ``gridd.db-wal`` is unlinked or
replaced under a running daemon, every commit still lands in the open file that no path
names any more: a clean stop would checkpoint it into the database, but after ``kill -9``
a restart finds no WAL (or another one) at the path, and everything since the last
checkpoint is gone. The same holds for ``gridd.db`` itself.

``FileGuard.changed`` tells, for each file, whether its path still names the file held
open: ``os.fstat`` of the descriptors this process holds for it (found in
``/proc/self/fd``) against ``os.stat`` of the path, by device and inode. The store then
checkpoints through its open connection at once, so nothing is lost, and reopens it, so
SQLite makes the files anew at their paths (``recreate_wal``; a database file gone is
written back by the store's own restore).

Where ``/proc/self/fd`` cannot be read (not Linux), the files are compared with what the
paths named when they were first seen, which still notices an unlink or a replacement.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gridd.dbguard import Problem, aside_name

log = logging.getLogger(__name__)

FD_DIR = Path("/proc/self/fd")
#: What the kernel adds to the link of a descriptor whose file has no name any more.
_DELETED = " (deleted)"

Ident = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True)
class Held:
    """A descriptor this process holds for one of the guarded files."""

    fd: int
    path: Path
    ident: Ident


def _ident(st: os.stat_result) -> Ident:
    return st.st_dev, st.st_ino


def _real(path: Path) -> Path:
    """``path`` with its directory resolved, as ``/proc/self/fd`` shows it (the file
    itself may be gone)."""
    return Path(os.path.realpath(path.parent)) / path.name


def held_files(paths: tuple[Path, ...], *, fd_dir: Path = FD_DIR) -> list[Held] | None:
    """The descriptors this process holds for ``paths`` (an unlinked file's too), or None
    when the process's descriptors cannot be listed."""
    wanted = {str(_real(p)): p for p in paths}
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    found = []
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue  # closed meanwhile, or not a link
        path = wanted.get(target.removesuffix(_DELETED))
        if path is None:
            continue
        try:
            found.append(Held(int(name), path, _ident(os.fstat(int(name)))))
        except (OSError, ValueError):
            continue
    return found


class FileGuard:
    """Notices the database or its WAL unlinked or replaced while they are open."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.wal_path = Path(f"{db_path}-wal")
        self._held: list[Held] = []
        #: Where descriptors cannot be listed: what each path named when first seen.
        self._seen: dict[Path, Ident | None] = {}
        self.rearm()

    def rearm(self) -> None:
        """Take the files as they are now (after a repair reopened them)."""
        paths = (self.db_path, self.wal_path)
        held = held_files(paths)
        self._held = held or []
        self._seen = {} if held is not None else {p: self._path_ident(p) for p in paths}

    @staticmethod
    def _path_ident(path: Path) -> Ident | None:
        try:
            return _ident(os.stat(path))
        except FileNotFoundError:
            return None

    def changed(self) -> dict[Path, str]:
        """Each guarded path that no longer names the file held open: ``unlinked`` (no
        file there, or it was moved away) or ``replaced`` (another file there)."""
        if not self._seen and not any(h.path == self.wal_path for h in self._held):
            self.rearm()  # SQLite opens the WAL with its first transaction
        found: dict[Path, str] = {}
        stale = False
        for held in self._held:
            try:
                if _ident(os.fstat(held.fd)) != held.ident:
                    stale = True  # closed, and the number reused: not ours any more
                    continue
            except OSError:
                stale = True
                continue
            now = self._path_ident(held.path)
            if now is None:
                found[held.path] = "unlinked"
            elif now != held.ident:
                found[held.path] = "replaced"
        for path, then in self._seen.items():
            now = self._path_ident(path)
            if then is not None and now != then:
                found[path] = "unlinked" if now is None else "replaced"
        if stale and not found:
            self.rearm()
        return found


def recreate_wal(
    conn: sqlite3.Connection,
    db_path: Path,
    what: str,
    *,
    reconnect: Callable[[Path], sqlite3.Connection],
) -> tuple[sqlite3.Connection, Problem]:
    """(The writer's thread, every other connection of this process closed.) The WAL at
    ``db_path`` was ``what`` (unlinked, replaced): checkpoint everything in the open one
    into the database through ``conn``, keep a file found at its path aside, and reopen,
    so that SQLite makes a new WAL there. Returns the new connection and what to report;
    raises ``sqlite3.Error`` (``conn`` still open, nothing moved) when the checkpoint
    could not take every frame (a reader of another process holds an old snapshot)."""
    wal = Path(f"{db_path}-wal")
    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy or copied != frames:
        raise sqlite3.OperationalError(
            f"checkpoint incomplete ({copied} of {frames} frames; busy={busy})"
        )
    moved: tuple[str, ...] = ()
    if what == "replaced":  # closing would delete whatever the path names now
        aside = aside_name(wal)
        wal.rename(aside)
        moved = (str(aside),)
    conn.close()
    new = reconnect(db_path)
    kept = f"; the file found in its place is kept as {Path(moved[0]).name}" if moved else ""
    problem = Problem(
        f"wal_{what}",
        f"{wal} was {what} while gridd ran: everything written to it was checkpointed into"
        f" {db_path.name} through the open file and a new {wal.name} made{kept}",
        moved,
    )
    log.error("%s", problem.message)
    return new, problem
