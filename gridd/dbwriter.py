"""The store's writer thread: every write to SQLite is committed here, off the event loop.

A write is a ``Batch`` (statements that commit together, and what runs once they have).
Batches are committed one at a time, in the order they were submitted, on one connection
that only this thread uses. SQLite's busy wait is short (``BUSY_WAIT_SECONDS``): a database
locked by someone else (another process's ``BEGIN EXCLUSIVE``, a backup tool) is retried
with a short pause for as long as it takes, and the event loop is never the one waiting.

Who waits for a batch decides what its failure means:

- A caller that waits (``Batch.wait``: the store's fast path while the database keeps up, and
  every caller outside an event loop) hears of a failure at once; the batch is rolled back
  and dropped, exactly as a failed ``COMMIT`` on the caller's own connection would be.
- A batch nobody waits for any more (the caller's wait ran out: the database is locked or
  slow) is *behind*: it is retried until it commits, however long that takes, so what the
  daemon already acted on is never dropped. Batches behind commit together, up to
  ``GROUP_MAX`` in one transaction, each still all or nothing. A full or read-only disk is retried too, more
  slowly; ``failing`` says why meanwhile (``/health``). Its ``on_done`` runs on the loop
  once it has committed, in submission order.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: SQLite's own busy wait per attempt: short, then the writer pauses and tries again.
BUSY_WAIT_SECONDS = 0.1
#: Pause between attempts of a batch that failed, doubling up to ``RETRY_MAX_SECONDS``.
RETRY_SECONDS = 0.02
RETRY_MAX_SECONDS = 1.0
#: A caller blocked in ``Batch.wait`` (outside the loop) hears of a lock held this long
#: (SQLite's default busy timeout): a command-line check must not wait forever.
LOCKED_GIVE_UP_SECONDS = 5.0
#: Queued writes committed together in one transaction, at most.
GROUP_MAX = 256

#: A statement of a batch, run on the writer's connection; returns what it wants to report.
Op = Callable[[sqlite3.Connection], Any]

PENDING, DONE, FAILED = "pending", "done", "failed"


class Batch:
    """Statements that commit together. ``raw``: run once, outside any transaction (a repair
    that replaces the connection itself, ``Writer.swap``)."""

    __slots__ = (
        "_lock",
        "callbacks",
        "done",
        "error",
        "notify",
        "ops",
        "raw",
        "result",
        "state",
        "submitted",
        "waiters",
        "waiting",
    )

    def __init__(self, ops: list[Op], *, raw: Callable[[Writer], Any] | None = None) -> None:
        self.ops = ops
        self.raw = raw
        #: Run on the caller's thread once the batch has committed (never on a failure).
        self.callbacks: list[Callable[[], None]] = []
        #: Loop futures of ``Store.durable`` callers, resolved once it is settled.
        self.waiters: list[Any] = []
        self.state = PENDING
        self.error: BaseException | None = None
        self.result: Any = None
        #: Someone blocks in ``wait``: a failure is theirs to hear, not the writer's to retry.
        self.waiting = True
        #: Hands a batch nobody waits for back to its owner once settled (on its loop).
        self.notify: Callable[[Batch], None] | None = None
        self.submitted = time.monotonic()
        self.done = threading.Event()
        self._lock = threading.Lock()

    def wait(self, timeout: float | None) -> bool:
        """Block until the batch is settled, or give it up to the writer after ``timeout``
        (False: it is behind now, and ``notify`` hears of it once it has committed)."""
        if self.done.wait(timeout):
            return True
        with self._lock:
            if self.state != PENDING:
                return True
            self.waiting = False
            return False

    def _settle(self, state: str, error: BaseException | None = None) -> bool:
        """Mark it settled; True when nobody waits for it (then ``notify`` must be called)."""
        with self._lock:
            self.state = state
            self.error = error
            self.done.set()
            return not self.waiting

    def _give_up_on_failure(self, error: BaseException) -> bool:
        """A failed attempt: True (and settled as failed) when its caller still waits."""
        with self._lock:
            if not self.waiting:
                return False
            self.state = FAILED
            self.error = error
            self.done.set()
            return True


class Writer:
    """One thread, one connection, batches committed in order."""

    def __init__(self, conn: sqlite3.Connection, *, name: str = "gridd-store-writer") -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_WAIT_SECONDS * 1000)}")
        self.conn = conn
        self._queue: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        #: The batch being committed and since when it is tried (monotonic), or None.
        self.head_since: float | None = None
        #: Why the batch being tried failed last (locked, disk full...), until it commits.
        self.failing: sqlite3.Error | None = None
        #: When the database was first found locked by someone else for the current batch.
        self.locked_since: float | None = None
        self.on_failure: Callable[[sqlite3.Error], None] | None = None
        self.on_commit: Callable[[], None] | None = None
        self._stop_by: float | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, batch: Batch) -> None:
        self._queue.put(batch)

    def close(self, timeout: float) -> bool:
        """Commit what is queued (trying for at most ``timeout`` seconds), then stop; the
        connection is closed by the caller. False when writes were left uncommitted."""
        self._stop_by = time.monotonic() + timeout
        self._queue.put(None)
        self._thread.join(timeout + BUSY_WAIT_SECONDS * 2)
        return not self._thread.is_alive() and self._queue.empty()

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        ahead: list[Batch | None] = []  # taken off the queue, not joining the group before
        while True:
            batch = ahead.pop() if ahead else self._queue.get()
            if batch is None:
                return
            group = [batch]
            # Writes nobody waits for commit together (group commit): a queue that grew
            # while the database was locked drains in a few transactions, not thousands.
            while not batch.waiting and batch.raw is None and len(group) < GROUP_MAX:
                try:
                    after = self._queue.get_nowait()
                except queue.Empty:
                    break
                if after is None or after.waiting or after.raw is not None:
                    ahead.append(after)
                    break
                group.append(after)
            done = self._commit(group)
            for member in group:
                member.ops = []  # a 50,000-task request's rows: not kept till the next write
            del batch, group
            if not done:
                return  # stopping with the database still refusing: the rest stays unsaved

    def _commit(self, group: list[Batch]) -> bool:
        started = self.head_since = time.monotonic()
        pause = RETRY_SECONDS
        try:
            while True:
                try:
                    results = self._attempt(group)
                except sqlite3.Error as exc:
                    waited = time.monotonic() - started
                    hopeful = is_locked(exc) and waited < LOCKED_GIVE_UP_SECONDS
                    if not hopeful and len(group) == 1 and group[0]._give_up_on_failure(exc):
                        return True
                    self._note_failure(exc)
                    if self._stop_by is not None and time.monotonic() >= self._stop_by:
                        log.error("store writer stopping with writes unsaved: %s", exc)
                        return False
                    time.sleep(pause)
                    pause = min(pause * 2, RETRY_MAX_SECONDS)
                    continue
                except Exception as exc:  # a bug in a statement: no retry can fix it
                    if len(group) > 1:  # find the one at fault: each on its own
                        return all(self._commit([member]) for member in group)
                    log.exception("a store write failed and was dropped")
                    if group[0]._settle(FAILED, exc) and group[0].notify is not None:
                        group[0].notify(group[0])
                    return True
                if self.failing is not None and self.on_commit is not None:
                    self.on_commit()
                self.failing = None
                self.locked_since = None
                for batch, result in zip(group, results, strict=True):
                    batch.result = result
                    if batch._settle(DONE) and batch.notify is not None:
                        batch.notify(batch)
                return True
        finally:
            self.head_since = None

    def _attempt(self, group: list[Batch]) -> list[Any]:
        """Commit the group's statements in one transaction; each batch's last result."""
        first = group[0]
        if first.raw is not None:
            return [first.raw(self)]
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            results = []
            for batch in group:
                result = None
                for op in batch.ops:
                    result = op(conn)
                results.append(result)
            conn.execute("COMMIT")
        except BaseException:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                log.error("rollback failed: %s", exc)
            raise
        return results

    def _note_failure(self, exc: sqlite3.Error) -> None:
        if self.failing is None or str(self.failing) != str(exc):
            log.warning("state database write waits: %s; retrying", exc)
        self.failing = exc
        if is_locked(exc):
            if self.locked_since is None:
                self.locked_since = time.monotonic()
        else:
            self.locked_since = None
        if self.on_failure is not None:
            self.on_failure(exc)

    def swap(self, conn: sqlite3.Connection) -> None:
        """Use ``conn`` from now on (called on this thread, by a ``raw`` batch)."""
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_WAIT_SECONDS * 1000)}")
        self.conn = conn


def is_locked(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY / SQLITE_LOCKED: someone else holds the database; it will pass."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(exc).lower()
    return "locked" in text or "busy" in text
