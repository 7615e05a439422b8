"""Faults slower or stranger than a kill are seen and reported, never spent (issue 30).

A ``.grid/`` that stops taking writes for a while pauses starts without counting any
attempt, says so on ``/health``, keeps running agents' results, and resumes by itself
(a real tmpfs: root only; skipped otherwise). A WAL unlinked or replaced under a running
daemon is noticed within seconds, checkpointed and made anew: a ``kill -9`` after it
loses nothing. Real daemons, real agents, real SQLite.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon, running_daemon, start_daemon
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for
from tests.test_disk_full import fill

#: How long ``.grid/`` stays read-only: longer than a few start retries and backoffs.
READ_ONLY_SECONDS = 10.0


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` read-only for everything that opens a file there from now on: a read-only
    bind mount over it. (A file system with files open for writing cannot be remounted
    read-only at all; the daemon's open state database keeps its descriptors, as it would
    on a disk that turned read-only under it in any way the kernel allows.)"""
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        # A file opened for writing through the new mount before it turns read-only (git's
        # index.lock, say) makes it busy for that moment: try again.
        _until_done(["mount", "-o", "remount,ro,bind", str(path)])
        yield
    finally:
        # A file a process opened through the read-only mount (a reader under load, say)
        # keeps it busy; past a while, detach it lazily: new opens see the writable disk.
        if not _until_done(["umount", str(path)], required=False):
            _until_done(["umount", "-l", str(path)])


def _until_done(argv: list[str], *, timeout: float = 10.0, required: bool = True) -> bool:
    deadline = time.monotonic() + timeout
    while (proc := subprocess.run(argv, capture_output=True, text=True)).returncode != 0:
        if time.monotonic() >= deadline:
            assert not required, f"{argv}: {proc.stderr}"
            return False
        time.sleep(0.05)
    return True


def test_a_read_only_grid_pauses_starts_without_counting_attempts_and_work_resumes(
    small_disk_repo: Path, tmp_path: Path
) -> None:
    root = small_disk_repo
    control = tmp_path / "control"
    control.mkdir()
    write_core_config(
        root,
        agents={"ticker": {"command": agent_command("ticker.py", str(control), "0.05")}},
        scheduler={"default_agent": "ticker"},
    )
    with core_daemon(root) as daemon:
        c = daemon.client()
        c.post("/session/start", {"maxAgents": 4})
        # One attempt each: a start the disk failed and that was counted fails the task.
        running = c.post("/tasks", {"title": "running", "maxAttempts": 1})["id"]
        wait_for(lambda: (control / f"{running}.pid").exists(), timeout=30)
        with read_only(root / ".grid"):
            started = time.monotonic()
            later = [
                c.post("/tasks", {"title": f"later {n}", "maxAttempts": 1})["id"] for n in range(3)
            ]
            (control / f"{running}.go").touch()  # it ends while nothing can be written
            # A warning may make /health degraded first (the running agent's monitor,
            # "watching paused", cannot write its run's state either); what this test
            # holds is that the disk is reported as such.
            health = wait_for(
                lambda: "disk" in (h := c.get("/health")).get("degraded", ()) and h,
                timeout=10,
                message="/health to say the disk is degraded",
            )
            assert health["status"] == "degraded", health
            assert any("read-only" in w for w in health["warnings"]), health
            for task_id in (running, *later):
                assert c.get(f"/tasks/{task_id}")["status"] in ("working", "ready")
            time.sleep(max(0.0, READ_ONLY_SECONDS - (time.monotonic() - started)))
            still = c.get("/health")
            assert "disk" in still["degraded"], still
        wait_for(lambda: c.get("/health")["status"] == "ok", timeout=20, message="/health ok")
        for task_id in later:
            wait_for(lambda t=task_id: (control / f"{t}.pid").exists(), timeout=30)
            (control / f"{task_id}.go").touch()
        for task_id in (running, *later):
            task = wait_task_status(c, task_id, "review", timeout=30)
            assert task["attempts"] == 1, task
        log = event_log(c)
    failed = [e.data for e in log if e.type == "task.start_failed"]
    assert failed, "no start met the read-only disk: the test proves nothing"
    assert all(f["counted"] is False for f in failed), failed
    downs = [e.data for e in log if e.type == "daemon.degraded" and e.data["part"] == "disk"]
    ups = [e.data for e in log if e.type == "daemon.recovered" and e.data["part"] == "disk"]
    assert len(downs) == 1 and len(ups) == 1, (downs, ups)
    warnings = [e.data for e in log if e.type == "agent.warning"]
    assert not warnings, warnings


def test_an_agent_that_ends_on_a_full_disk_keeps_its_result_and_work_resumes(
    small_disk_repo: Path, tmp_path: Path
) -> None:
    """Its shim waits for room to write ``exit.json`` (it is not taken for a dead
    supervisor); /health says the disk is full meanwhile, starts paused; once space is
    back the run is finished as it ended, on its one attempt."""
    root = small_disk_repo
    control = tmp_path / "control"
    control.mkdir()
    write_core_config(
        root,
        agents={"ticker": {"command": agent_command("ticker.py", str(control), "0.05")}},
        scheduler={"default_agent": "ticker"},
    )
    with core_daemon(root) as daemon:
        c = daemon.client()
        task_id = c.post("/tasks", {"title": "ends on a full disk", "maxAttempts": 1})["id"]
        c.post(f"/tasks/{task_id}/start")
        wait_for(lambda: (control / f"{task_id}.pid").exists(), timeout=30)
        filler = fill(root / ".grid")
        (control / f"{task_id}.go").touch()
        wait_for(lambda: (control / f"{task_id}.done").exists(), timeout=30)
        health = wait_for(
            lambda: "disk" in (h := c.get("/health"))["degraded"] and h,
            timeout=15,
            message="/health to say the disk is full",
        )
        assert any("full" in w and "starts are paused" in w for w in health["warnings"]), health
        time.sleep(3)  # a hold, not a measure: a shim that died would have failed it by now
        assert c.get(f"/tasks/{task_id}")["status"] == "working"
        filler.unlink()
        task = wait_task_status(c, task_id, "review", timeout=30)
        assert task["attempts"] == 1, task
        wait_for(lambda: c.get("/health")["status"] == "ok", timeout=20, message="/health ok")
        warnings = [e.data for e in event_log(c) if e.type == "agent.warning"]
    assert not warnings, warnings


@pytest.mark.parametrize("how", ["unlinked", "replaced"])
def test_a_wal_unlinked_or_replaced_under_a_running_daemon_loses_nothing_across_kill9(
    repo: Path, how: str
) -> None:
    wal = repo / ".grid" / "gridd.db-wal"
    before = [f"before {n}" for n in range(200)]
    after = [f"after {n}" for n in range(50)]
    daemon = start_daemon(repo)
    try:
        c = daemon.client()
        c.post("/tasks", [{"title": t} for t in before])
        assert wal.stat().st_size > 0, "the tasks should still be in the WAL"
        if how == "unlinked":
            wal.unlink()
        else:  # another (empty) file put in its place
            stranger = wal.with_name("stranger")
            stranger.write_bytes(b"")
            os.replace(stranger, wal)
        health = wait_for(
            lambda: (h := c.get("/health"))["status"] == "degraded" and h,
            timeout=10,
            message="/health to say what happened to the WAL",
        )
        assert any("gridd.db-wal" in w and how in w for w in health["warnings"]), health
        (problem,) = [e.data for e in event_log(c) if e.type == "daemon.store_problem"]
        assert problem["kind"] == f"wal_{how}", problem
        c.post("/tasks", [{"title": t} for t in after])  # written to the new WAL
    finally:
        daemon.kill9()
    with running_daemon(repo) as again:
        titles = sorted(t["title"] for t in again.client().get("/tasks"))
    assert titles == sorted(before + after)
