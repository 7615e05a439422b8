"""The state database's schema and connections: the versioned migrations, the two
connections a store opens (the writer's, migrated; the reader's, read-only), and a
database that cannot be read moved aside, never replaced silently.

The schema is versioned (``PRAGMA user_version``) and grows by appending to
``MIGRATIONS``.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from gridd.dbguard import Problem
from gridd.errors import StoreError

log = logging.getLogger(__name__)

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

#: SQLite's busy wait for a read (WAL: only a checkpoint or recovery can hold one up).
READ_WAIT_SECONDS = 0.5


@dataclass
class OpenReport:
    """What happened while opening the database, for the daemon to announce."""

    quarantined: list[Path] = field(default_factory=list)
    reason: str | None = None
    #: Silent-loss checks (see ``dbguard``) and rows that could not be loaded.
    problems: list[Problem] = field(default_factory=list)


def quarantine(db_path: Path, reason: str) -> list[Path]:
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


def connect_and_migrate(path: Path) -> sqlite3.Connection:
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
            for statement in split_sql(MIGRATIONS[target - 1]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")
            conn.execute("COMMIT")
            log.info("state database migrated to schema version %d", target)
    except BaseException:
        conn.close()
        raise
    return conn


def connect_reader(path: Path) -> sqlite3.Connection:
    """The connection reads use: never a writer, so in WAL mode nobody blocks it for long."""
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=READ_WAIT_SECONDS
    )
    conn.execute("PRAGMA query_only = 1")
    return conn


def split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
