"""Persistence: one SQLite database (WAL mode) owning the event log and domain state.

Only this module talks SQL. The schema is versioned (``PRAGMA user_version``) and grows by
appending to ``MIGRATIONS``. A database that cannot be read is never replaced silently: it
is moved aside to ``gridd.db.corrupt-<timestamp>`` and the move is reported to the caller,
who publishes it as an event and a health warning.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from gridd.dbguard import (
    FileWatch,
    Problem,
    aside_name,
    check_before_open,
    new_identity,
    read_marker,
    write_marker,
)
from gridd.errors import StoreError
from gridd.model import Agent, Event, Question, Task, isotime, utcnow

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
    """The daemon's SQLite state. Methods are synchronous and fast (WAL, NORMAL sync)."""

    def __init__(self, conn: sqlite3.Connection, path: Path, report: OpenReport) -> None:
        self._conn = conn
        self.path = path
        self.report = report
        self._after_commit: list[Callable[[], None]] = []
        self._watch = FileWatch(path)
        # Ids are handed out from here, never by SQLite alone: a rolled-back insert would
        # otherwise give its id to the next event (and a client may have been told of it).
        self._next_event_id = self._max_event_id() + 1
        #: The last write refused by a full or read-only disk, until ``probe_write`` finds
        #: the disk writable again (``/health`` shows ``store`` degraded meanwhile).
        self.write_error: StoreError | None = None

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

    def close(self) -> None:
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass
        self._conn.close()

    # -- low-level helpers --------------------------------------------------------------

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
        except (sqlite3.OperationalError, sqlite3.DatabaseError) as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise
            raise self._noted(_store_error(exc)) from exc

    def _exec_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """``executemany``, any failure of the database a ``StoreError``."""
        try:
            self._conn.executemany(sql, rows)
        except (sqlite3.OperationalError, sqlite3.DatabaseError) as exc:
            raise self._noted(_store_error(exc)) from exc

    def _noted(self, error: StoreError) -> StoreError:
        if error.code in DISK_CODES:
            self.write_error = error
        return error

    def probe_write(self, *, margin: int = PROBE_MARGIN_BYTES) -> bool:
        """Whether the disk takes writes again: it has ``margin`` bytes free, is not
        read-only, and a small write commits. Clears ``write_error`` when it does."""
        if self.write_error is None:
            return True
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
        self.write_error = None
        return True

    def transaction(self) -> _Transaction:
        return _Transaction(self)

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the open transaction commits (at once when none is open);
        a rollback forgets it. This is how an event is published only once it is durable."""
        if self._conn.in_transaction:
            self._after_commit.append(callback)
        else:
            callback()

    def _committed(self) -> None:
        callbacks, self._after_commit = self._after_commit, []
        for callback in callbacks:
            callback()

    def _rolled_back(self) -> None:
        self._after_commit.clear()

    # -- events --------------------------------------------------------------------------

    def append_event(self, type_: str, data: dict[str, Any], ts: datetime | None = None) -> Event:
        ts = ts or utcnow()
        payload = json.dumps(data, separators=(",", ":"), default=str, allow_nan=False)
        event_id = self._next_event_id
        self._exec(
            "INSERT INTO events(id, type, data, ts) VALUES (?, ?, ?, ?)",
            (event_id, type_, payload, isotime(ts)),
        )
        # Spent even if the insert is rolled back later: ids only ever go up.
        self._next_event_id = event_id + 1
        event = Event(id=event_id, type=type_, data=data, ts=ts)
        event._json = payload
        event._nbytes = len(payload)
        return event

    def append_events(self, type_: str, datas: list[dict[str, Any]]) -> list[Event]:
        """Many events of one type, one timestamp, one statement (``executemany``): the
        output pass's chunks. Call inside a transaction."""
        ts = utcnow()
        stamp = isotime(ts)
        first = self._next_event_id
        events, rows = [], []
        for n, data in enumerate(datas):
            payload = json.dumps(data, separators=(",", ":"), default=str, allow_nan=False)
            rows.append((first + n, type_, payload, stamp))
            event = Event(id=first + n, type=type_, data=data, ts=ts)
            event._json = payload
            event._nbytes = len(payload)
            events.append(event)
        try:
            self._conn.executemany(
                "INSERT INTO events(id, type, data, ts) VALUES (?, ?, ?, ?)", rows
            )
        except (sqlite3.OperationalError, sqlite3.DatabaseError) as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise
            raise self._noted(_store_error(exc)) from exc
        self._next_event_id = first + len(rows)  # spent even if rolled back, as above
        return events

    @property
    def last_appended_id(self) -> int:
        """The id of the last event appended (committed or still in a transaction)."""
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
        """Drop all but the newest ``retain`` events; returns how many were removed."""
        cutoff = self.last_event_id() - retain
        mark = self.positions_mark()
        if mark is not None:
            cutoff = min(cutoff, mark)  # output positions after the mark live in the log
        if cutoff <= 0:
            return 0
        cur = self._exec("DELETE FROM events WHERE id <= ?", (cutoff,))
        return cur.rowcount

    # -- tasks and agents -------------------------------------------------------------------

    def save_tasks(self, tasks: Iterable[Task]) -> None:
        """Insert or replace tasks (call inside ``transaction()`` for many)."""
        rows = [(t.id, t.status.value, t.model_dump_json()) for t in tasks]
        self._exec_many(
            "INSERT INTO tasks(id, status, doc) VALUES (?, ?, ?)"
            " ON CONFLICT(id) DO UPDATE SET status = excluded.status, doc = excluded.doc",
            rows,
        )

    def load_tasks(self) -> list[Task]:
        return self._load("tasks", Task)

    def save_agent(self, agent: Agent) -> None:
        self._exec(
            "INSERT INTO agents(id, task_id, status, doc) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(id) DO UPDATE SET status = excluded.status, doc = excluded.doc",
            (agent.id, agent.task_id, agent.status.value, agent.model_dump_json()),
        )

    def save_output_positions(
        self, rows: Iterable[tuple[int, str, str]], *, through: int | None = None
    ) -> None:
        """Each agent's published output position, ``(output_seq, last_output, agent_id)``:
        two fields of its document set in place (SQLite's ``json_set``), with no model
        validated or encoded. ``through``: every ``agent.output`` event up to this id is
        now reflected in its agent's row (``load_agents`` reads only the log after it).
        Saved every few seconds, not per line (``GridState.note_output``)."""
        self._exec_many(
            "UPDATE agents SET doc = json_set(doc, '$.output_seq', ?, '$.last_output', ?)"
            " WHERE id = ?",
            rows,
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
        self._exec(
            "INSERT INTO questions(id, agent_id, status, doc) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(id) DO UPDATE SET status = excluded.status, doc = excluded.doc",
            (question.id, question.agent_id, question.status.value, question.model_dump_json()),
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
        with self.transaction():
            self.set_meta(key, json.dumps({"doc": doc, "reason": reason}))
            column = "key" if table == "meta" else "id"
            self._exec(f"DELETE FROM {table} WHERE {column} = ?", (row_id,))
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
        to its path (whatever was put there is kept aside). None when all is well."""
        what = self._watch.changed()
        if what is None or self._conn.in_transaction:
            return None
        moved: tuple[str, ...] = ()
        tmp = self.path.with_name(self.path.name + ".restore")
        tmp.unlink(missing_ok=True)
        try:
            dest = sqlite3.connect(tmp)
            try:
                self._conn.backup(dest)
            finally:
                dest.close()
            if what == "replaced":
                aside = aside_name(self.path)
                self.path.rename(aside)
                moved = (str(aside),)
            old = self._conn
            try:
                old.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            old.close()
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            os.replace(tmp, self.path)
            self._conn = self._connect_and_migrate(self.path)
        except (OSError, sqlite3.Error) as exc:
            log.error("cannot restore %s: %s", self.path, exc)
            return Problem(
                f"db_{what}",
                f"{self.path} was {what} while gridd ran, and writing it back failed ({exc});"
                " the daemon still holds the data: do not stop it before fixing the disk",
            )
        self._watch.rearm()
        problem = Problem(
            f"db_{what}",
            f"{self.path} was {what} while gridd ran; the live database was written back"
            + (f" (the file found there is kept as {Path(moved[0]).name})" if moved else ""),
            moved,
        )
        log.error("%s", problem.message)
        return problem

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
        row = self._exec("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._exec(
            "INSERT INTO meta(key, value) VALUES (?, ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )


class _Transaction:
    """``with store.transaction():`` groups writes atomically. Callbacks registered with
    ``after_commit`` inside it (the event bus's fan-out) run only once it has committed."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._conn = store._conn

    def __enter__(self) -> None:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._store._noted(_store_error(exc)) from exc

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as commit_error:
                self._rollback()
                raise self._store._noted(_store_error(commit_error)) from commit_error
            self._store._committed()
        else:
            self._rollback()

    def _rollback(self) -> None:
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.error("rollback failed: %s", exc)
        self._store._rolled_back()


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


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
