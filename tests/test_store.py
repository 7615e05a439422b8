"""The SQLite store: the durable event log, schema migration, and quarantine of bad files."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from gridd.errors import StoreError
from gridd.store import MIGRATIONS, SCHEMA_VERSION, Store


def test_event_ids_increase_strictly_and_replay_in_order(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "gridd.db")
    try:
        ids = [store.append_event("t.x", {"n": n}).id for n in range(1200)]
        assert ids == list(range(1, 1201))
        seen: list[int] = []
        since = 0
        while page := store.events_after(since, limit=500):
            seen += [e.id for e in page]
            since = page[-1].id
        assert seen == ids
        assert store.events_after(600, limit=1)[0].data == {"n": 600}
    finally:
        store.close()


def test_event_ids_are_never_reused_after_pruning_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "gridd.db"
    store = Store.open(path)
    for n in range(300):
        store.append_event("t.x", {"n": n})
    assert store.prune_events(100) == 200
    assert store.first_event_id() == 201
    assert store.last_event_id() == 300
    store.close()
    store = Store.open(path)
    try:
        assert store.append_event("t.y", {}).id == 301
        assert store.prune_events(1000) == 0
    finally:
        store.close()


def test_empty_log_reports_oldest_as_one_past_latest(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "gridd.db")
    try:
        assert (store.first_event_id(), store.last_event_id()) == (1, 0)
    finally:
        store.close()


def test_replay_filters_by_type(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "gridd.db")
    try:
        for n in range(30):
            store.append_event(("a.one", "b.two", "c.three")[n % 3], {"n": n})
        got = store.events_after(0, types=["a.one", "c.three"])
        assert {e.type for e in got} == {"a.one", "c.three"}
        assert len(got) == 20
        assert [e.id for e in got] == sorted(e.id for e in got)
    finally:
        store.close()


def _database_at(path: Path, version: int) -> None:
    """A database as an older gridd left it: migrations 1..version, with a row per table."""
    conn = sqlite3.connect(path, isolation_level=None)
    for script in MIGRATIONS[:version]:
        conn.executescript(script)
    conn.execute(f"PRAGMA user_version = {version}")
    if version >= 1:
        conn.execute(
            "INSERT INTO events(type, data, ts) VALUES ('old.event', '{\"kept\":true}',"
            " '2024-01-01T00:00:00Z')"
        )
    else:
        conn.execute("CREATE TABLE unrelated_keepsake (x TEXT)")
        conn.execute("INSERT INTO unrelated_keepsake VALUES ('still here')")
    conn.close()


@pytest.mark.parametrize("version", range(SCHEMA_VERSION))
def test_older_schema_is_migrated_in_place_keeping_data(tmp_path: Path, version: int) -> None:
    path = tmp_path / "gridd.db"
    _database_at(path, version)
    store = Store.open(path)
    try:
        assert store.report.quarantined == []
        assert store.append_event("new.event", {}).id == (2 if version >= 1 else 1)
        if version >= 1:
            assert store.events_after(0)[0].data == {"kept": True}
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        if version == 0:
            assert conn.execute("SELECT x FROM unrelated_keepsake").fetchone()[0] == "still here"
    finally:
        conn.close()


def test_newer_schema_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "gridd.db"
    _database_at(path, SCHEMA_VERSION)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError) as info:
        Store.open(path)
    assert info.value.code == "schema_too_new"
    assert "newer than this gridd understands" in info.value.message
    assert path.exists()
    assert not list(tmp_path.glob("*.corrupt-*"))


@pytest.mark.parametrize(
    "garbage",
    [os.urandom(8192), b"this is not a database\n", b"SQLite format 3\x00" + os.urandom(4000)],
    ids=["random", "text", "bad-header"],
)
def test_unreadable_database_is_moved_aside_with_its_bytes_intact(
    tmp_path: Path, garbage: bytes
) -> None:
    path = tmp_path / "gridd.db"
    path.write_bytes(garbage)
    store = Store.open(path)
    try:
        assert len(store.report.quarantined) == 1
        moved = store.report.quarantined[0]
        assert moved.name.startswith("gridd.db.corrupt-")
        assert moved.read_bytes() == garbage
        assert store.report.reason
        assert store.append_event("fresh", {}).id == 1
    finally:
        store.close()


def test_two_quarantines_in_the_same_second_keep_both_files(tmp_path: Path) -> None:
    path = tmp_path / "gridd.db"
    first, second = b"first corrupt file" * 10, b"second corrupt file" * 10
    path.write_bytes(first)
    Store.open(path).close()
    path.unlink()
    path.write_bytes(second)
    Store.open(path).close()
    kept = sorted(p.read_bytes() for p in tmp_path.glob("gridd.db.corrupt-*"))
    assert kept == sorted([first, second])
