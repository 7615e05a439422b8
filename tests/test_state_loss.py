"""Silent state loss is never silent: a row that cannot load, a 0-byte database, a damaged
WAL after ``kill -9``, a database unlinked under a running daemon. Each is detected, the
bad file or row is kept aside, the daemon starts anyway, and the loss is reported in the
log, on ``/health`` and as a ``daemon.store_problem`` event. Real daemons, real SQLite."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from gridd.client import GridClient
from tests.support.api import wait_task_status
from tests.support.daemons import DaemonProc, core_daemon, running_daemon, start_daemon
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for


def problems(d: DaemonProc) -> list[dict[str, object]]:
    return [e.data for e in event_log(d.client(), types={"daemon.store_problem"})]


def test_a_task_row_that_cannot_load_is_kept_aside_and_the_daemon_starts(repo: Path) -> None:
    with running_daemon(repo) as d:
        c = d.client()
        c.post("/tasks", [{"id": "good", "title": "fine"}, {"id": "bad", "title": "broken"}])
    db = repo / ".grid" / "gridd.db"
    conn = sqlite3.connect(db)
    doc = json.loads(conn.execute("SELECT doc FROM tasks WHERE id = 'bad'").fetchone()[0])
    doc["title"] = None  # what a PATCH with an explicit null used to store
    doc["priority"] = 99
    conn.execute("UPDATE tasks SET doc = ? WHERE id = 'bad'", (json.dumps(doc),))
    conn.commit()
    conn.close()
    with running_daemon(repo) as d:
        c = d.client()
        assert [t["id"] for t in c.get("/tasks")] == ["good"]
        health = c.get("/health")
        assert health["status"] == "degraded"
        assert any("'bad'" in w for w in health["warnings"]), health
        (found,) = problems(d)
        assert found["kind"] == "row_unreadable"
        assert "quarantined.tasks.bad" in str(found["movedTo"])
        c.post("/tasks", {"id": "after", "title": "still works"})
    conn = sqlite3.connect(db)
    kept = conn.execute("SELECT value FROM meta WHERE key LIKE 'quarantined.tasks.bad.%'")
    assert json.loads(json.loads(kept.fetchone()[0])["doc"])["priority"] == 99
    conn.close()


def test_a_zero_byte_database_is_reported_not_started_empty_silently(repo: Path) -> None:
    with running_daemon(repo) as d:
        d.client().post("/tasks", {"id": "t1", "title": "one"})
    db = repo / ".grid" / "gridd.db"
    db.write_bytes(b"")
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    with running_daemon(repo) as d:
        health = d.client().get("/health")
        assert health["status"] == "degraded"
        assert any("0 bytes" in w for w in health["warnings"]), health
        (found,) = problems(d)
        assert found["kind"] == "db_empty"
        (kept,) = found["movedTo"]  # type: ignore[misc]
        assert Path(str(kept)).exists()


def test_a_deleted_database_is_reported(repo: Path) -> None:
    with running_daemon(repo) as d:
        d.client().post("/tasks", {"id": "t1", "title": "one"})
    for suffix in ("", "-wal", "-shm"):
        Path(f"{repo / '.grid' / 'gridd.db'}{suffix}").unlink(missing_ok=True)
    with running_daemon(repo) as d:
        assert d.client().get("/health")["status"] == "degraded"
        assert [p["kind"] for p in problems(d)] == ["db_missing"]


def test_a_garbled_wal_after_kill9_is_copied_aside_and_reported(repo: Path) -> None:
    d = start_daemon(repo)
    try:
        d.client().post("/tasks", [{"id": f"t{n}", "title": f"task {n}"} for n in range(50)])
    finally:
        d.kill9()
    wal = repo / ".grid" / "gridd.db-wal"
    data = bytearray(wal.read_bytes())
    assert len(data) > 32 + 24 + 4096 * 2, "the change should still be in the WAL"
    middle = len(data) // 2
    data[middle : middle + 64] = b"\xff" * 64
    wal.write_bytes(bytes(data))
    with running_daemon(repo) as d:
        health = d.client().get("/health")
        assert health["status"] == "degraded"
        kinds = [p["kind"] for p in problems(d)]
        assert "wal_garbled" in kinds, kinds
    copies = list((repo / ".grid").glob("gridd.db-wal.corrupt-*"))
    assert len(copies) == 1 and copies[0].read_bytes() == bytes(data)


def test_a_database_unlinked_while_running_is_written_back(repo: Path) -> None:
    db = repo / ".grid" / "gridd.db"
    with running_daemon(repo) as d:
        c = d.client()
        c.post("/tasks", {"id": "precious", "title": "do not lose me"})
        db.unlink()
        wait_for(lambda: db.exists(), timeout=15, message="the database to be written back")
        health = wait_for(lambda: (h := c.get("/health"))["status"] == "degraded" and h, timeout=10)
        assert any("unlinked" in w for w in health["warnings"]), health
        c.post("/tasks", {"id": "later", "title": "written after the restore"})
    with running_daemon(repo) as d:
        ids = {t["id"] for t in d.client().get("/tasks")}
        assert ids == {"precious", "later"}
        assert d.client().get("/health")["status"] == "ok"


def _run_one_task(c: GridClient, task_id: str) -> dict[str, object]:
    """Run ``task_id`` to review; the agent that did it, as ``GET /agents`` shows it."""
    c.post("/tasks", {"id": task_id, "title": f"write {task_id}.txt", "agent": "work"})
    c.post(f"/tasks/{task_id}/start")
    task = wait_task_status(c, task_id, "review")
    assert task["changedFiles"] == [f"{task_id}.txt"], task
    (agent,) = [a for a in c.get("/agents", params={"all": "1"}) if a["taskId"] == task_id]
    return agent  # type: ignore[no-any-return]


def test_after_a_quarantine_a_new_agent_never_reuses_an_old_run_directory(repo: Path) -> None:
    # Agent numbers were kept in the database: a fresh one would start again at work-1,
    # in the old run directory, and report the old run's exit as the new task's result.
    write_core_config(repo, agents={"work": {"command": agent_command("trivial.py")}})
    with core_daemon(repo) as d:
        old = _run_one_task(d.client(), "before")
    old_run = Path(str(old["runDir"]))
    kept = {p.name: p.read_bytes() for p in old_run.iterdir() if p.is_file()}
    db = repo / ".grid" / "gridd.db"
    db.write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    with core_daemon(repo) as d:
        c = d.client()
        assert c.get("/health")["status"] == "degraded"  # the database was set aside
        new = _run_one_task(c, "after")
        assert new["id"] != old["id"]
        assert Path(str(new["runDir"])) != old_run
        log = c.get(f"/agents/{new['id']}/output")["chunks"]
        assert "working on after" in "".join(ch["chunk"] for ch in log)
    # The old run is left exactly as it was: nothing overwritten, nothing removed.
    assert {p.name: p.read_bytes() for p in old_run.iterdir() if p.is_file()} == kept


def test_leftover_run_directories_in_a_fresh_database_are_never_reused(repo: Path) -> None:
    # A .grid/ copied from elsewhere (or a database deleted by hand): runs, no records.
    write_core_config(repo, agents={"work": {"command": agent_command("trivial.py")}})
    runs = repo / ".grid" / "runs"
    for name in ("work-1", "work-2", "other-9"):
        (runs / name).mkdir(parents=True)
        (runs / name / "exit.json").write_text('{"exitCode": 0}')
        (runs / name / "spec.json").write_text(f'"left by {name}"')
    with core_daemon(repo) as d:
        new = _run_one_task(d.client(), "fresh")
    assert new["id"] not in {"work-1", "work-2", "other-9"}
    for name in ("work-1", "work-2", "other-9"):
        assert sorted(p.name for p in (runs / name).iterdir()) == ["exit.json", "spec.json"]
        assert (runs / name / "spec.json").read_text() == f'"left by {name}"'
