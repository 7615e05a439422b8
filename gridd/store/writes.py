"""The store's writes: each made on the caller's thread and committed by the writer
thread (``gridd.dbwriter``) in the order made, alone or gathered in a transaction; what
runs after a commit (the event bus's fan-out); a disk that refuses writes; and the
``meta`` table, kept in memory so that reading it never waits.

``Writes`` is the base of ``Store`` (``gridd.store.database``): the event log and the
domain tables write through it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gridd.dbwriter import DONE, FAILED, Batch, Op, Writer
from gridd.errors import StoreError
from gridd.model import utcnow

log = logging.getLogger(__name__)

#: The codes of a disk that refuses writes (a full or read-only one).
DISK_CODES = frozenset({"disk_full", "disk_read_only"})
#: Free bytes the disk must have before a store that hit a full disk is called writable.
PROBE_MARGIN_BYTES = 1024 * 1024
#: How long a write made on the event loop waits for its commit before the loop goes on
#: (it stays queued and commits later): the most the loop ever waits on the database.
SYNC_WAIT_SECONDS = 0.05
#: Queued writes finished (their after-commit callbacks run) per turn of the event loop.
FINISH_PER_TURN = 32
#: A write waiting this long turns ``/health`` degraded, with the reason (``slow_reason``).
SLOW_AFTER_SECONDS = 1.0


class Writes:
    """Writes and reads on the store's two connections, and the memory that follows
    them (``meta``, the open transaction, the queued tail). Set up by ``Store.__init__``."""

    path: Path
    _reader: sqlite3.Connection
    _writer: Writer
    #: The ``meta`` table as this daemon has written it (committed or queued).
    _meta: dict[str, str]
    #: The transaction being gathered on the caller's thread (``transaction()``).
    _open: _Open | None
    #: The last write handed over without waiting for it, until it has committed.
    _tail: Batch | None
    _durable_waiters: list[asyncio.Future[None]]
    #: Queued batches committed, waiting for their turn to be finished (``_settled``).
    _finished: deque[Batch]
    #: The last write refused by a full or read-only disk, until ``probe_write`` finds
    #: the disk writable again (``/health`` shows ``store`` degraded meanwhile).
    write_error: StoreError | None
    _loop: asyncio.AbstractEventLoop | None

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """A read on the reader connection; any failure of the database a ``StoreError``."""
        try:
            return self._reader.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise store_error(exc) from exc

    def _write(self, op: Op, *, undo: Callable[[], None] | None = None) -> Any:
        """Run ``op`` on the writer: in the open transaction, or as a batch of its own.
        ``undo`` puts the memory of this store back if the write fails at once."""
        if self._open is not None:
            self._open.ops.append(op)
            if undo is not None:
                self._open.undo.append(undo)
            return None
        return self._submit(Batch([op]), [undo] if undo is not None else [])

    def _submit(self, batch: Batch, undo: list[Callable[[], None]], *, wait: bool = True) -> Any:
        """Hand ``batch`` to the writer. Outside an event loop, or when nothing is queued
        before it (and ``wait``), wait for its commit (up to ``SYNC_WAIT_SECONDS`` on a loop): its failure
        is then the caller's, raised here with the batch rolled back. Otherwise it is queued
        behind the others and its ``callbacks`` run once it has committed."""
        loop = _running_loop()
        if loop is not None:
            self._loop = loop
            batch.notify = self._notify
            if self._tail is not None or not wait:
                # The disk refuses writes: refuse more, as at once, unless room came back
                # since (the writer's next try of the queued writes clears the error).
                if self.write_error is not None and not self._room():
                    for step in reversed(undo):
                        step()
                    raise self.write_error
                batch.waiting = False
                self._tail = batch
                self._writer.submit(batch)
                return None
        self._writer.submit(batch)
        if not batch.wait(SYNC_WAIT_SECONDS if loop is not None else None):
            self._tail = batch
            log.debug("state database slow: a write goes on in the background")
            return None
        if batch.state == FAILED:
            for step in reversed(undo):
                step()
            error = batch.error
            if isinstance(error, sqlite3.Error):
                raise self._noted(store_error(error)) from error
            raise StoreError(f"state database write failed: {error}") from error
        callbacks, batch.callbacks = batch.callbacks, []
        for callback in callbacks:
            callback()
        return batch.result

    def _notify(self, batch: Batch) -> None:
        """(Writer thread.) A batch nobody waited for is settled: finish it on its loop."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._settled, batch)
        except RuntimeError:
            pass  # the loop has closed (the daemon is stopping): nobody is left to tell

    def _settled(self, batch: Batch) -> None:
        """(Loop.) Finish queued batches in order, ``FINISH_PER_TURN`` per turn of the loop:
        when a lock clears, hundreds commit at once, and their events reach subscribers a
        turn at a time (a stream drains its queue in between instead of being dropped)."""
        self._finished.append(batch)
        if len(self._finished) == 1:
            asyncio.get_running_loop().call_soon(self._finish_some)

    def _finish_some(self) -> None:
        finished = self._finished
        for _ in range(FINISH_PER_TURN):
            if not finished:
                return
            self._finish(finished[0])
            finished.popleft()
        if finished:
            asyncio.get_running_loop().call_soon(self._finish_some)

    def _finish(self, batch: Batch) -> None:
        """(Loop.) A queued batch has committed (or was dropped as a bug): what waited for
        it runs, in the order the batches were made."""
        if batch is self._tail:
            self._tail = None
            waiters, self._durable_waiters = self._durable_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        callbacks, batch.callbacks = batch.callbacks, []
        if batch.state == DONE:
            for callback in callbacks:
                callback()

    def _queued_write_failed(self, exc: sqlite3.Error) -> None:
        """(Writer thread.) A queued batch failed and will be tried again."""
        error = store_error(exc)
        if error.code in DISK_CODES:
            self.write_error = error
            loop = self._loop
            if loop is not None:
                try:
                    loop.call_soon_threadsafe(self._fail_durable_waiters, error)
                except RuntimeError:
                    pass

    def _fail_durable_waiters(self, error: StoreError) -> None:
        """A client waiting for its change to be durable hears that the disk refuses it
        (it is kept in memory and written once the disk takes writes again)."""
        waiters, self._durable_waiters = self._durable_waiters, []
        queued = StoreError(
            f"{error.message.split(':')[0]}: the change is kept in memory and is written"
            " once the disk takes writes again",
            code=error.code,
        )
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(queued)

    def _queued_write_committed(self) -> None:
        """(Writer thread.) A queued batch that had failed has committed after all."""
        self.write_error = None

    async def durable(self) -> None:
        """Wait until every write made so far has committed (at once when none is queued).
        Raises ``StoreError`` if the disk refuses them meanwhile."""
        if self._tail is None:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._durable_waiters.append(waiter)
        await waiter

    @property
    def queued(self) -> bool:
        """Writes are queued that have not committed yet (the database is slow or locked)."""
        return self._tail is not None

    def slow_reason(self) -> str | None:
        """Why writes wait, once one has waited ``SLOW_AFTER_SECONDS`` (for ``/health``);
        None while the database keeps up."""
        writer = self._writer
        since = writer.head_since
        if since is None:
            return None
        waited = time.monotonic() - since
        if waited < SLOW_AFTER_SECONDS:
            return None
        locked = writer.locked_since
        if locked is not None:
            return f"database locked for {time.monotonic() - locked:.0f} s (by another process)"
        failing = writer.failing
        why = f": {failing}" if failing is not None else ""
        return f"database slow: a write has waited {waited:.0f} s{why}"

    def _noted(self, error: StoreError) -> StoreError:
        if error.code in DISK_CODES:
            self.write_error = error
        return error

    def _room(self, margin: int = PROBE_MARGIN_BYTES) -> bool:
        """Whether the database's disk is writable with ``margin`` bytes free (statvfs)."""
        try:
            fs = os.statvfs(self.path.parent)
        except OSError:
            return False
        return not fs.f_flag & os.ST_RDONLY and fs.f_bavail * fs.f_frsize >= margin

    def probe_write(self, *, margin: int = PROBE_MARGIN_BYTES) -> bool:
        """Whether the disk takes writes again: it has ``margin`` bytes free, is not
        read-only, and a small write commits. Clears ``write_error`` when it does."""
        if self.write_error is None:
            return True
        if self._tail is not None:
            return False  # the writer tries the queued writes itself; they clear it
        if not self._room(margin):
            return False
        try:
            with self.transaction():
                self.set_meta("write_probe", utcnow().isoformat())
        except StoreError:
            return False
        if self._tail is None:
            self.write_error = None
        return self.write_error is None

    def transaction(self, *, wait: bool = True) -> _Transaction:
        """Writes gathered and committed as one batch (``_Transaction``). ``wait=False`` for
        a batch known to take long (50,000 tasks): on the loop it is queued at once instead
        of holding the loop ``SYNC_WAIT_SECONDS`` first, as if that wait had run out."""
        return _Transaction(self, wait=wait)

    @property
    def in_transaction(self) -> bool:
        return self._open is not None

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once what was written so far has committed: at the commit of the
        open transaction, of the last queued write, or at once. A rollback forgets it. This
        is how an event is published only once it is durable."""
        if self._open is not None:
            self._open.callbacks.append(callback)
        elif self._tail is not None:
            self._tail.callbacks.append(callback)
        else:
            callback()

    def next_counter(self, name: str, *, past: int = 0) -> int:
        """A persistent counter (agent numbers never repeat across restarts): one more than
        both its last value and ``past`` (what a new database cannot know, e.g. the runs
        left on disk)."""
        key = f"counter.{name}"
        value = max(int(self.get_meta(key) or 0), past) + 1
        self.set_meta(key, str(value))
        return value

    def get_meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def set_meta(self, key: str, value: str) -> None:
        before = self._meta.get(key)
        self._meta[key] = value

        def undo() -> None:
            if before is None:
                self._meta.pop(key, None)
            else:
                self._meta[key] = before

        self._write(
            lambda c: c.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            ),
            undo=undo,
        )

    def _forget_meta(self, key: str) -> None:
        before = self._meta.pop(key, None)
        if before is not None and self._open is not None:
            self._open.undo.append(lambda: self._meta.__setitem__(key, before))


class _Open:
    """A transaction being gathered: its statements, what runs at its commit, and how to
    put the store's memory back if it fails."""

    __slots__ = ("callbacks", "ops", "undo")

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.callbacks: list[Callable[[], None]] = []
        self.undo: list[Callable[[], None]] = []


class _Transaction:
    """``with store.transaction():`` groups writes atomically: they are gathered, then
    committed as one batch when the block ends (and forgotten if it raises). Callbacks
    registered with ``after_commit`` inside it (the event bus's fan-out) run only once it
    has committed."""

    def __init__(self, store: Writes, *, wait: bool = True) -> None:
        self._store = store
        self._wait = wait

    def __enter__(self) -> None:
        if self._store._open is not None:
            raise StoreError(
                "state database error: cannot start a transaction within a transaction"
            )
        self._store._open = _Open()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        store = self._store
        gathered, store._open = store._open, None
        assert gathered is not None
        if exc_type is not None:
            for step in reversed(gathered.undo):
                step()
            return
        if not gathered.ops:
            for callback in gathered.callbacks:
                store.after_commit(callback)
            return
        batch = Batch(gathered.ops)
        batch.callbacks = gathered.callbacks
        store._submit(batch, gathered.undo, wait=self._wait)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


#: SQLite's words for a disk it cannot write to, and the code each becomes (507).
_DISK_PROBLEMS = (
    ("full", "disk_full", "the disk holding the state database is full"),
    ("readonly", "disk_read_only", "the state database is on a read-only disk"),
    ("read-only", "disk_read_only", "the state database is on a read-only disk"),
)


def store_error(exc: sqlite3.Error) -> StoreError:
    text = str(exc).lower()
    for word, code, what in _DISK_PROBLEMS:
        if word in text:
            return StoreError(
                f"{what}: nothing was recorded; free space (or make it writable) and retry ({exc})",
                code=code,
            )
    return StoreError(f"state database error: {exc}", code="store_error")
