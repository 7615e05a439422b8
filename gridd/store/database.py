"""The state database as a file: opened (created, migrated, or quarantined when it
cannot be read), given an identity, closed with its queued writes, and written back
when it or its WAL is unlinked or replaced under a running daemon."""

from __future__ import annotations

import logging
import os
import sqlite3
from collections import deque
from pathlib import Path

from gridd.dbguard import (
    Problem,
    aside_name,
    check_before_open,
    new_identity,
    read_marker,
    write_marker,
)
from gridd.dbwriter import FAILED, Batch, Writer
from gridd.errors import StoreError
from gridd.store.schema import OpenReport, connect_and_migrate, connect_reader, quarantine
from gridd.store.tables import Tables
from gridd.walguard import FileGuard, recreate_wal

log = logging.getLogger(__name__)

#: Stopping, queued writes are tried this long before the daemon gives up on them.
CLOSE_TIMEOUT_SECONDS = 10.0


class Store(Tables):
    """The daemon's SQLite state.

    Writes are committed by the writer thread (``gridd.dbwriter``), in the order they were
    made. On the event loop a write waits for its commit only briefly (``SYNC_WAIT_SECONDS``)
    and only when nothing is queued before it: while the database keeps up a write has
    committed (or raised ``StoreError``) when the call returns, as on a connection of its
    own. When it does not keep up (locked by another process, a slow disk), the write stays
    queued and the loop goes on: what runs "after the commit" (``after_commit``: the event
    bus's fan-out) runs when it has committed, and ``await durable()`` waits for that.
    Reads use a second connection on the caller's thread (WAL: never blocked by a writer);
    the ``meta`` table is also kept in memory, so reading it never waits.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, report: OpenReport) -> None:
        self.path = path
        self.report = report
        self._reader = connect_reader(path)
        self._watch = FileGuard(path)
        self._meta = {
            str(k): str(v) for k, v in self._reader.execute("SELECT key, value FROM meta")
        }
        self._open = None
        self._tail = None
        self._durable_waiters = []
        self._finished = deque()
        # Ids are handed out from here, never by SQLite alone: a rolled-back insert would
        # otherwise give its id to the next event (and a client may have been told of it).
        self._next_event_id = self._max_event_id() + 1
        self.write_error = None
        self._writer = Writer(conn)
        self._writer.on_failure = self._queued_write_failed
        self._writer.on_commit = self._queued_write_committed
        self._loop = None

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path) -> Store:
        """Open (creating or migrating) the database; quarantine it if it is corrupt."""
        report = OpenReport(problems=check_before_open(path))
        try:
            conn = connect_and_migrate(path)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "disk" in str(exc).lower():
                raise StoreError(f"cannot open {path}: {exc}", code="disk_full") from None
            report.reason = str(exc)
            report.quarantined = quarantine(path, str(exc))
            try:
                conn = connect_and_migrate(path)
            except sqlite3.DatabaseError as exc2:
                raise StoreError(f"cannot create a new database at {path}: {exc2}") from None
        store = cls(conn, path, report)
        store._check_identity()
        return store

    def _check_identity(self) -> None:
        """Give a new database its identity; notice one that is not the one gridd made."""
        marker = read_marker(self.path)
        identity = self.get_meta("identity")
        if identity is None:
            identity = new_identity()
            self.set_meta("identity", identity)
            if marker is not None and not self.report.problems and not self.report.quarantined:
                self.report.problems.append(
                    Problem(
                        "db_replaced",
                        f"{self.path} holds no gridd state although gridd had a database"
                        f" there (identity {marker}); the old state is not in it",
                    )
                )
        elif marker is not None and marker != identity:
            self.report.problems.append(
                Problem(
                    "db_replaced",
                    f"{self.path} is another database (identity {identity}) than the one"
                    f" gridd last used there ({marker})",
                )
            )
        if marker != identity:
            write_marker(self.path, identity)

    def close(self, *, timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
        """Commit every queued write (trying for at most ``timeout`` seconds), checkpoint
        and close both connections. A disk that refuses writes is given a second, not
        ``timeout``: stopping must not wait on a full disk."""
        if self.write_error is not None:
            timeout = min(timeout, 1.0)
        if not self._writer.close(timeout):
            log.error(
                "STATE DATABASE: writes still queued after %.0f s could not be saved (%s)",
                timeout,
                self._writer.failing,
            )
        conn = self._writer.conn
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass
        conn.close()
        self._reader.close()

    def check_file(self) -> Problem | None:
        """Notice the database unlinked or replaced under us and write the live copy back
        to its path (whatever was put there is kept aside). None when all is well.

        The copy is made on the writer thread, after every write queued before it (so it
        holds them), and waited for: a rare repair, not a write the loop makes often."""
        changed = self._watch.changed()
        what = changed.get(self.path)
        if what is None and self._watch.wal_path in changed:
            return self._recreate_wal(changed[self._watch.wal_path])
        if what is None or self._open is not None:
            return None
        batch = Batch([], raw=lambda writer: self._restore(writer, what))
        batch.waiting = True
        self._writer.submit(batch)
        batch.wait(None)
        if batch.state == FAILED or isinstance(batch.result, Problem):
            if isinstance(batch.result, Problem):
                return batch.result
            return Problem(f"db_{what}", f"{self.path} was {what}; restoring it failed")
        self._reader.close()
        self._reader = connect_reader(self.path)
        self._watch.rearm()
        moved: tuple[str, ...] = batch.result
        problem = Problem(
            f"db_{what}",
            f"{self.path} was {what} while gridd ran; the live database was written back"
            + (f" (the file found there is kept as {Path(moved[0]).name})" if moved else ""),
            moved,
        )
        log.error("%s", problem.message)
        return problem

    def _recreate_wal(self, what: str) -> Problem | None:
        """The WAL was unlinked or replaced under us: checkpoint it through the open
        connection, then reopen both, so that a new one is made at its path
        (``walguard.recreate_wal``). Waits for a moment with no write queued: the
        checkpoint must hold every write made before it."""
        if self._open is not None or self._tail is not None:
            return None  # the next check (a second later) tries again
        self._reader.close()  # no connection of ours may keep the old WAL open
        batch = Batch([], raw=lambda writer: self._rewal(writer, what))
        self._writer.submit(batch)
        batch.wait(None)
        self._reader = connect_reader(self.path)
        self._watch.rearm()
        if batch.state == FAILED:
            log.error("cannot checkpoint the WAL that was %s: %s; retrying", what, batch.error)
            return None
        problem: Problem = batch.result
        return problem

    def _rewal(self, writer: Writer, what: str) -> Problem:
        """(Writer thread.) ``recreate_wal`` on the writer's connection."""
        conn, problem = recreate_wal(writer.conn, self.path, what, reconnect=connect_and_migrate)
        writer.swap(conn)
        return problem

    def _restore(self, writer: Writer, what: str) -> tuple[str, ...] | Problem:
        """(Writer thread.) Write the live database back to its path; reconnect to it."""
        moved: tuple[str, ...] = ()
        tmp = self.path.with_name(self.path.name + ".restore")
        tmp.unlink(missing_ok=True)
        try:
            dest = sqlite3.connect(tmp)
            try:
                writer.conn.backup(dest)
            finally:
                dest.close()
            if what == "replaced":
                aside = aside_name(self.path)
                self.path.rename(aside)
                moved = (str(aside),)
            old = writer.conn
            try:
                old.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            old.close()
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            os.replace(tmp, self.path)
            writer.swap(connect_and_migrate(self.path))
        except (OSError, sqlite3.Error) as exc:
            log.error("cannot restore %s: %s", self.path, exc)
            return Problem(
                f"db_{what}",
                f"{self.path} was {what} while gridd ran, and writing it back failed ({exc});"
                " the daemon still holds the data: do not stop it before fixing the disk",
            )
        return moved
