"""Persistence: one SQLite database (WAL mode) owning the event log and domain state.

Only this module talks SQL. The schema is versioned (``PRAGMA user_version``) and grows by
appending to ``MIGRATIONS``. A database that cannot be read is never replaced silently: it
is moved aside to ``gridd.db.corrupt-<timestamp>`` and the move is reported to the caller,
who publishes it as an event and a health warning.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from gridd.dbguard import (
    Problem,
    aside_name,
    check_before_open,
    new_identity,
    read_marker,
    write_marker,
)
from gridd.dbwriter import DONE, FAILED, Batch, Op, Writer
from gridd.errors import StoreError
from gridd.model import Agent, Event, Question, Task, isotime, utcnow
from gridd.walguard import FileGuard, recreate_wal

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

#: Each entry upgrades the schema by one version; never edit a released entry.
MIGRATIONS: list[str] = [
    # 1: the durable event log
    """
    CREATE TABLE events (
        id   INTEGER PRIMARY KEY AUTOINCREMENT,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        ts   TEXT NOT NULL
    );
    CREATE INDEX events_type ON events(type, id);
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 2: tasks and agents, each a JSON document keyed by id
    """
    CREATE TABLE tasks (
        id     TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        doc    TEXT NOT NULL
    );
    CREATE TABLE agents (
        id      TEXT PRIMARY KEY,
        task_id TEXT NOT NULL,
        status  TEXT NOT NULL,
        doc     TEXT NOT NULL
    );
    CREATE INDEX agents_task ON agents(task_id);
    """,
    # 3: questions agents asked a human
    """
    CREATE TABLE questions (
        id       TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        status   TEXT NOT NULL,
        doc      TEXT NOT NULL
    );
    CREATE INDEX questions_status ON questions(status);
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)


#: The codes of a disk that refuses writes (a full or read-only one).
DISK_CODES = frozenset({"disk_full", "disk_read_only"})
#: Free bytes the disk must have before a store that hit a full disk is called writable.
PROBE_MARGIN_BYTES = 1024 * 1024
#: meta key: the event id up to which agents' rows hold their output positions; the
#: ``agent.output`` events after it say the rest (``load_agents``).
POSITIONS_MARK = "output.positions_through"
#: The last line shown of an agent's output (``Agent.last_output``) is cut to this.
LAST_LINE_CHARS = 300
#: How long a write made on the event loop waits for its commit before the loop goes on
#: (it stays queued and commits later): the most the loop ever waits on the database.
SYNC_WAIT_SECONDS = 0.05
#: Queued writes finished (their after-commit callbacks run) per turn of the event loop.
FINISH_PER_TURN = 32
#: A write waiting this long turns ``/health`` degraded, with the reason (``slow_reason``).
SLOW_AFTER_SECONDS = 1.0
#: Stopping, queued writes are tried this long before the daemon gives up on them.
CLOSE_TIMEOUT_SECONDS = 10.0
#: SQLite's busy wait for a read (WAL: only a checkpoint or recovery can hold one up).
READ_WAIT_SECONDS = 0.5


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (its end, at most ``LAST_LINE_CHARS``); ""."""
    line = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "")
    return line[-LAST_LINE_CHARS:]


@dataclass
class OpenReport:
    """What happened while opening the database, for the daemon to announce."""

    quarantined: list[Path] = field(default_factory=list)
    reason: str | None = None
    #: Silent-loss checks (see ``dbguard``) and rows that could not be loaded.
    problems: list[Problem] = field(default_factory=list)


def _quarantine(db_path: Path, reason: str) -> list[Path]:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    # Never overwrite an earlier quarantine (two in one second, or a clock set back).
    base, n = stamp, 1
    while any(Path(f"{db_path}.corrupt-{stamp}{s}").exists() for s in ("", "-wal", "-shm")):
        n += 1
        stamp = f"{base}.{n}"
    moved = []
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{db_path}{suffix}")
        if src.exists():
            dst = Path(f"{db_path}.corrupt-{stamp}{suffix}")
            src.rename(dst)
            moved.append(dst)
    log.error(
        "STATE DATABASE UNREADABLE (%s): moved aside to %s; starting with a new, empty database",
        reason,
        ", ".join(str(p) for p in moved),
    )
    return moved


class Store:
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
        self._reader = _connect_reader(path)
        self._watch = FileGuard(path)
        #: The ``meta`` table as this daemon has written it (committed or queued).
        self._meta: dict[str, str] = {
            str(k): str(v) for k, v in self._reader.execute("SELECT key, value FROM meta")
        }
        #: The transaction being gathered on the caller's thread (``transaction()``).
        self._open: _Open | None = None
        #: The last write handed over without waiting for it, until it has committed.
        self._tail: Batch | None = None
        self._durable_waiters: list[asyncio.Future[None]] = []
        #: Queued batches committed, waiting for their turn to be finished (``_settled``).
        self._finished: deque[Batch] = deque()
        # Ids are handed out from here, never by SQLite alone: a rolled-back insert would
        # otherwise give its id to the next event (and a client may have been told of it).
        self._next_event_id = self._max_event_id() + 1
        #: The last write refused by a full or read-only disk, until ``probe_write`` finds
        #: the disk writable again (``/health`` shows ``store`` degraded meanwhile).
        self.write_error: StoreError | None = None
        self._writer = Writer(conn)
        self._writer.on_failure = self._queued_write_failed
        self._writer.on_commit = self._queued_write_committed
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path) -> Store:
        """Open (creating or migrating) the database; quarantine it if it is corrupt."""
        report = OpenReport(problems=check_before_open(path))
        try:
            conn = cls._connect_and_migrate(path)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "disk" in str(exc).lower():
                raise StoreError(f"cannot open {path}: {exc}", code="disk_full") from None
            report.reason = str(exc)
            report.quarantined = _quarantine(path, str(exc))
            try:
                conn = cls._connect_and_migrate(path)
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

    @staticmethod
    def _connect_and_migrate(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            check = conn.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {check}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                conn.close()
                raise StoreError(
                    f"{path} has schema version {version}, newer than this gridd understands"
                    f" ({SCHEMA_VERSION}); run the newer gridd or restore a backup",
                    code="schema_too_new",
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                conn.execute("BEGIN IMMEDIATE")
                for statement in _split_sql(MIGRATIONS[target - 1]):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {target}")
                conn.execute("COMMIT")
                log.info("state database migrated to schema version %d", target)
        except BaseException:
            conn.close()
            raise
        return conn

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

    # -- reading ---------------------------------------------------------------------------

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """A read on the reader connection; any failure of the database a ``StoreError``."""
        try:
            return self._reader.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise _store_error(exc) from exc

    # -- writing ---------------------------------------------------------------------------

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
                if self.write_error is not None:
                    for step in reversed(undo):
                        step()
                    raise self.write_error  # the disk refuses writes: refuse more, as at once
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
                raise self._noted(_store_error(error)) from error
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
        error = _store_error(exc)
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

    def probe_write(self, *, margin: int = PROBE_MARGIN_BYTES) -> bool:
        """Whether the disk takes writes again: it has ``margin`` bytes free, is not
        read-only, and a small write commits. Clears ``write_error`` when it does."""
        if self.write_error is None:
            return True
        if self._tail is not None:
            return False  # the writer tries the queued writes itself; they clear it
        try:
            fs = os.statvfs(self.path.parent)
        except OSError:
            return False
        if fs.f_flag & os.ST_RDONLY or fs.f_bavail * fs.f_frsize < margin:
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

    # -- events --------------------------------------------------------------------------

    def append_event(self, type_: str, data: dict[str, Any], ts: datetime | None = None) -> Event:
        ts = ts or utcnow()
        payload = encode_payload(data)
        event_id = self._next_event_id
        row = (event_id, type_, payload, isotime(ts))
        # Spent even if the insert is rolled back later: ids only ever go up.
        self._next_event_id = event_id + 1
        self._write(lambda c: c.execute(_INSERT_EVENT, row))
        event = Event(id=event_id, type=type_, data=data, ts=ts)
        event._json = payload
        event._nbytes = len(payload)
        return event

    def append_events(
        self, type_: str, datas: list[dict[str, Any]], *, payloads: list[str] | None = None
    ) -> list[Event]:
        """Many events of one type, one timestamp, one statement (``executemany``): the
        output pass's chunks. Call inside a transaction. ``payloads``: the datas already
        encoded (``encode_payload``, e.g. on a worker thread)."""
        ts = utcnow()
        stamp = isotime(ts)
        first = self._next_event_id
        events, rows = [], []
        for n, data in enumerate(datas):
            payload = payloads[n] if payloads is not None else encode_payload(data)
            rows.append((first + n, type_, payload, stamp))
            event = Event(id=first + n, type=type_, data=data, ts=ts)
            event._json = payload
            event._nbytes = len(payload)
            events.append(event)
        self._next_event_id = first + len(rows)  # spent even if rolled back, as above
        self._write(lambda c: c.executemany(_INSERT_EVENT, rows))
        return events

    @property
    def last_appended_id(self) -> int:
        """The id of the last event appended (committed, queued or in a transaction)."""
        return self._next_event_id - 1

    def events_after(
        self, since: int, *, types: Iterable[str] | None = None, limit: int = 500
    ) -> list[Event]:
        type_list = sorted(set(types)) if types else None
        if type_list:
            marks = ",".join("?" * len(type_list))
            rows = self._exec(
                f"SELECT id, type, data, ts FROM events WHERE id > ? AND type IN ({marks})"
                " ORDER BY id LIMIT ?",
                (since, *type_list, limit),
            ).fetchall()
        else:
            rows = self._exec(
                "SELECT id, type, data, ts FROM events WHERE id > ? ORDER BY id LIMIT ?",
                (since, limit),
            ).fetchall()
        events = []
        for r in rows:
            event = Event(
                id=r[0], type=r[1], data=json.loads(r[2]), ts=datetime.fromisoformat(r[3])
            )
            event._json = r[2]
            event._nbytes = len(r[2])
            events.append(event)
        return events

    def last_event_id(self) -> int:
        """The id of the last event committed."""
        row = self._exec("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        return int(row[0]) if row else 0

    def _max_event_id(self) -> int:
        row = self._exec("SELECT MAX(id) FROM events").fetchone()
        top = int(row[0]) if row and row[0] is not None else 0
        return max(top, self.last_event_id())

    def first_event_id(self) -> int:
        """The oldest id still retained (``last + 1`` when the log is empty)."""
        row = self._exec("SELECT MIN(id) FROM events").fetchone()
        return int(row[0]) if row and row[0] is not None else self.last_event_id() + 1

    def prune_events(self, retain: int) -> int:
        """Drop all but the newest ``retain`` events; returns how many were removed (0 when
        the delete is still queued behind slow writes)."""
        cutoff = self.last_event_id() - retain
        mark = self.positions_mark()
        if mark is not None:
            cutoff = min(cutoff, mark)  # output positions after the mark live in the log
        if cutoff <= 0:
            return 0
        removed = self._write(
            lambda c: c.execute("DELETE FROM events WHERE id <= ?", (cutoff,)).rowcount
        )
        return int(removed or 0)

    # -- tasks and agents -------------------------------------------------------------------

    def save_tasks(self, tasks: Iterable[Task]) -> None:
        """Insert or replace tasks (call inside ``transaction()`` for many)."""
        self.save_task_rows(task_rows(tasks))

    def save_task_rows(self, rows: list[tuple[str, str, str]]) -> None:
        """``save_tasks`` with the rows already encoded (``task_rows``)."""
        self._write(
            lambda c: c.executemany(
                "INSERT INTO tasks(id, status, doc) VALUES (?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET status = excluded.status, doc = excluded.doc",
                rows,
            )
        )

    def load_tasks(self) -> list[Task]:
        return self._load("tasks", Task)

    def save_agent(self, agent: Agent) -> None:
        row = (agent.id, agent.task_id, agent.status.value, agent.model_dump_json())
        self._write(
            lambda c: c.execute(
                "INSERT INTO agents(id, task_id, status, doc) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET status = excluded.status, doc = excluded.doc",
                row,
            )
        )

    def save_output_positions(
        self, rows: Iterable[tuple[int, str, str]], *, through: int | None = None
    ) -> None:
        """Each agent's published output position, ``(output_seq, last_output, agent_id)``:
        two fields of its document set in place (SQLite's ``json_set``), with no model
        validated or encoded. ``through``: every ``agent.output`` event up to this id is
        now reflected in its agent's row (``load_agents`` reads only the log after it).
        Saved every few seconds, not per line (``GridState.note_output``)."""
        listed = list(rows)
        self._write(
            lambda c: c.executemany(
                "UPDATE agents SET doc = json_set(doc, '$.output_seq', ?, '$.last_output', ?)"
                " WHERE id = ?",
                listed,
            )
        )
        if through is not None:
            self.set_meta(POSITIONS_MARK, str(through))

    def positions_mark(self) -> int | None:
        """The id up to which agents' rows hold their output positions (None: all of it,
        as a database from before positions were saved lazily)."""
        raw = self.get_meta(POSITIONS_MARK)
        return int(raw) if raw is not None else None

    def load_agents(self) -> list[Agent]:
        """Every agent, its output position the later of its row's and the ``agent.output``
        events logged after the positions mark: both are committed with the events, so a
        daemon killed at any point gets back exactly what it had published."""
        agents = self._load("agents", Agent)
        tail = self._output_tail()
        if not tail:
            return agents
        loaded = []
        for agent in agents:
            found = tail.get(agent.id)
            if found is not None and found[0] > agent.output_seq:
                seq, last = found
                agent = agent.model_copy(
                    update={"output_seq": seq, "last_output": last or agent.last_output}
                )
            loaded.append(agent)
        return loaded

    def _output_tail(self) -> dict[str, tuple[int, str]]:
        """Agent id -> (highest seq, its last line shown) among ``agent.output`` events
        after the positions mark."""
        mark = self.positions_mark()
        if mark is None:
            return {}
        rows = self._exec(
            "SELECT data FROM events WHERE type = 'agent.output' AND id > ? ORDER BY id",
            (mark,),
        ).fetchall()
        tail: dict[str, tuple[int, str]] = {}
        for (raw,) in rows:
            try:
                data = json.loads(raw)
                agent_id, seq, chunk = str(data["agentId"]), int(data["seq"]), data["chunk"]
            except (ValueError, KeyError, TypeError):
                continue  # not ours to judge here; the log keeps it as it is
            before = tail.get(agent_id)
            if before is None or seq > before[0]:
                tail[agent_id] = (seq, last_line(str(chunk)) or (before[1] if before else ""))
        return tail

    def save_question(self, question: Question) -> None:
        row = (question.id, question.agent_id, question.status.value, question.model_dump_json())
        self._write(
            lambda c: c.execute(
                "INSERT INTO questions(id, agent_id, status, doc) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET status = excluded.status, doc = excluded.doc",
                row,
            )
        )

    def load_questions(self) -> list[Question]:
        return self._load("questions", Question)

    def _load(self, table: str, model: type[M]) -> list[M]:
        """Every row of ``table`` that loads; one that does not is moved aside (into
        ``meta`` as ``quarantined.<table>.<id>``) and reported, never fatal."""
        rows = self._exec(f"SELECT id, doc FROM {table} ORDER BY rowid").fetchall()
        loaded = []
        for row_id, doc in rows:
            try:
                loaded.append(model.model_validate_json(doc))
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                self.quarantine_row(table, str(row_id), str(doc), str(exc).splitlines()[0:3])
        return loaded

    def quarantine_row(self, table: str, row_id: str, doc: str, reason: list[str]) -> None:
        key = f"quarantined.{table}.{row_id}.{int(time.time())}"
        column = "key" if table == "meta" else "id"
        with self.transaction():
            self.set_meta(key, json.dumps({"doc": doc, "reason": reason}))
            self._write(lambda c: c.execute(f"DELETE FROM {table} WHERE {column} = ?", (row_id,)))
            if table == "meta":
                self._forget_meta(row_id)
        problem = Problem(
            "row_unreadable",
            f"{table} row {row_id!r} cannot be loaded ({'; '.join(reason)}); kept aside in"
            f" the meta table as {key!r}",
            (key,),
        )
        log.error("%s", problem.message)
        self.report.problems.append(problem)

    # -- the file under us ----------------------------------------------------------------

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
        self._reader = _connect_reader(self.path)
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
        self._reader = _connect_reader(self.path)
        self._watch.rearm()
        if batch.state == FAILED:
            log.error("cannot checkpoint the WAL that was %s: %s; retrying", what, batch.error)
            return None
        problem: Problem = batch.result
        return problem

    def _rewal(self, writer: Writer, what: str) -> Problem:
        """(Writer thread.) ``recreate_wal`` on the writer's connection."""
        conn, problem = recreate_wal(
            writer.conn, self.path, what, reconnect=self._connect_and_migrate
        )
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
            writer.swap(self._connect_and_migrate(self.path))
        except (OSError, sqlite3.Error) as exc:
            log.error("cannot restore %s: %s", self.path, exc)
            return Problem(
                f"db_{what}",
                f"{self.path} was {what} while gridd ran, and writing it back failed ({exc});"
                " the daemon still holds the data: do not stop it before fixing the disk",
            )
        return moved

    def next_counter(self, name: str, *, past: int = 0) -> int:
        """A persistent counter (agent numbers never repeat across restarts): one more than
        both its last value and ``past`` (what a new database cannot know, e.g. the runs
        left on disk)."""
        key = f"counter.{name}"
        value = max(int(self.get_meta(key) or 0), past) + 1
        self.set_meta(key, str(value))
        return value

    # -- key/value metadata ----------------------------------------------------------------

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

    def __init__(self, store: Store, *, wait: bool = True) -> None:
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


def _connect_reader(path: Path) -> sqlite3.Connection:
    """The connection reads use: never a writer, so in WAL mode nobody blocks it for long."""
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=READ_WAIT_SECONDS
    )
    conn.execute("PRAGMA query_only = 1")
    return conn


_INSERT_EVENT = "INSERT INTO events(id, type, data, ts) VALUES (?, ?, ?, ?)"


#: SQLite's words for a disk it cannot write to, and the code each becomes (507).
_DISK_PROBLEMS = (
    ("full", "disk_full", "the disk holding the state database is full"),
    ("readonly", "disk_read_only", "the state database is on a read-only disk"),
    ("read-only", "disk_read_only", "the state database is on a read-only disk"),
)


def _store_error(exc: sqlite3.Error) -> StoreError:
    text = str(exc).lower()
    for word, code, what in _DISK_PROBLEMS:
        if word in text:
            return StoreError(
                f"{what}: nothing was recorded; free space (or make it writable) and retry ({exc})",
                code=code,
            )
    return StoreError(f"state database error: {exc}", code="store_error")


def encode_payload(data: dict[str, Any]) -> str:
    """An event's data as the log stores it (and streams send it)."""
    return json.dumps(data, separators=(",", ":"), default=str, allow_nan=False)


def task_rows(tasks: Iterable[Task]) -> list[tuple[str, str, str]]:
    """Tasks as rows of the ``tasks`` table: ``(id, status, doc)``."""
    return [(t.id, t.status.value, t.model_dump_json()) for t in tasks]


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
