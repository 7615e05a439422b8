"""State check: can *this* gridd read a workspace's database? Read-only, never migrates.

Used before an upgrade hands over (``gridd --check-state`` run with the new code, while the
old daemon still serves) and by ``gridctl doctor``. It opens ``gridd.db`` with SQLite's
``mode=ro``, runs ``quick_check``, and compares the schema version (``PRAGMA user_version``)
with what this version knows: older schemas are migrated at start-up, newer ones refused.
"""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gridd import HANDOVER_ADOPTS, HANDOVER_PROTOCOL, __version__
from gridd.store import SCHEMA_VERSION


@dataclass
class StateReport:
    """What was found, and whether this version can start on it."""

    path: str
    gridd_version: str = __version__
    supported_schema: int = SCHEMA_VERSION
    handover: int = HANDOVER_PROTOCOL
    adopts: list[int] = field(default_factory=lambda: sorted(HANDOVER_ADOPTS))
    exists: bool = False
    schema: int | None = None
    integrity: str = "not checked"
    counts: dict[str, int] = field(default_factory=dict)
    readable: bool = False
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(schema: int, integrity: str) -> str | None:
    """Why this version cannot use a database, or None when it can (pure)."""
    if integrity != "ok":
        return f"the database fails SQLite's quick_check: {integrity}"
    if schema > SCHEMA_VERSION:
        return (
            f"the database has schema {schema}, newer than this gridd's {SCHEMA_VERSION}"
            f" (gridd {__version__}): it was written by a newer gridd"
        )
    return None


def check_state(db_path: Path) -> StateReport:
    report = StateReport(path=str(db_path))
    if not db_path.exists():
        report.readable = True
        report.integrity = "no database yet"
        report.schema = 0
        return report
    report.exists = True
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        report.problem = f"cannot open {db_path} read-only: {exc}"
        return report
    try:
        report.schema = int(conn.execute("PRAGMA user_version").fetchone()[0])
        rows = conn.execute("PRAGMA quick_check").fetchall()
        report.integrity = "; ".join(str(r[0]) for r in rows[:5]) or "ok"
        if report.schema >= 1 and report.integrity == "ok":
            report.counts["events"] = int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
        if report.schema >= 2 and report.integrity == "ok":
            for table in ("tasks", "agents"):
                row = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
                report.counts[table] = int(row[0])
    except sqlite3.DatabaseError as exc:
        report.problem = f"{db_path} is not a readable gridd database: {exc}"
        return report
    finally:
        conn.close()
    report.problem = verdict(report.schema, report.integrity)
    report.readable = report.problem is None
    return report
