"""A full disk under ``.grid/``: requests that must write answer 507 with a clear error,
the daemon keeps serving, agents are not left stuck, it recovers by itself once space
returns, and no event id is ever handed out twice.

The workspace's ``.grid`` is a small tmpfs mounted for the test (root only; skipped
otherwise), filled with a filler file and emptied again.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from gridd.model import TaskStatus
from gridd.specs import TaskSpec
from tests.support.cli import run_gridd
from tests.support.daemons import inprocess_daemon, running_daemon, start_daemon
from tests.support.repos import FAST_SCHEDULER, agent_command
from tests.support.sse import EventFollower, event_log
from tests.support.waits import until


def fill(path: Path) -> Path:
    """Fill the file system holding ``path`` until it has no byte left."""
    filler = path / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler


def post_task(client: object, title: str) -> tuple[int, dict[str, object]]:
    http = client._http  # type: ignore[attr-defined]
    response = http.post("/tasks", json={"title": title, "prompt": "x" * 20_000})
    return response.status_code, response.json()


def test_full_disk_is_507_and_recovers_by_itself_without_reusing_event_ids(
    small_disk_repo: Path,
) -> None:
    root = small_disk_repo
    with running_daemon(root) as daemon, EventFollower(daemon.sock) as follower:
        client = daemon.client()
        status, doc = post_task(client, "before")
        assert status == 201, doc
        filler = fill(root / ".grid")
        answers = [post_task(client, f"during {n}") for n in range(40)]
        refused = [doc for status, doc in answers if status != 201]
        assert refused, "the disk never filled up"
        for status, doc in answers:
            if status != 201:
                assert status == 507, doc
                error = doc["error"]
                assert isinstance(error, dict)
                assert error["code"] == "disk_full"
                assert "full" in str(error["message"])
        assert client.get("/health")["pid"] == daemon.proc.pid
        filler.unlink()
        status, doc = post_task(client, "after")
        assert status == 201, doc
        last = client.get("/state")["daemon"]["lastEventId"]
        follower.wait(lambda evs: evs and evs[-1].id >= last, message="the follower to catch up")
        live = follower.snapshot()
    ids = [e.id for e in live]
    assert ids == sorted(set(ids)), "an event id was handed out twice"
    logged = {e["id"]: e for e in _log(root)}
    for event in live:
        assert event.id in logged, f"event {event.id} ({event.type}) was heard but never stored"
        assert logged[event.id]["type"] == event.type


def test_health_is_degraded_while_the_disk_is_full_and_recovers_by_itself(
    small_disk_repo: Path,
) -> None:
    """No request but /health is needed: the daemon notices the disk took writes again."""
    root = small_disk_repo
    with running_daemon(root) as daemon:
        client = daemon.client()
        http = client._http  # type: ignore[attr-defined]
        assert http.get("/health").json()["status"] == "ok"
        filler = fill(root / ".grid")
        answers = [post_task(client, f"during {n}")[0] for n in range(40)]
        assert 507 in answers, answers
        response = http.get("/health")
        assert response.status_code == 503, response.text
        health = response.json()
        assert health["status"] == "degraded"
        assert "store" in health["degraded"]
        assert any("full" in w for w in health["warnings"])
        filler.unlink()
        deadline = time.monotonic() + 20
        while (response := http.get("/health")).status_code != 200:
            assert time.monotonic() < deadline, f"never recovered: {response.text}"
            time.sleep(0.1)
        assert response.json()["status"] == "ok", response.text
        assert "store" not in response.json()["degraded"]
        status, doc = post_task(client, "after")
        assert status == 201, doc
    recovered = [e["data"] for e in _log(root) if e["type"] == "daemon.recovered"]
    assert {"part": "store"} in recovered, recovered
    assert {"part": "disk"} in recovered, recovered  # starts were paused, and resumed


#: ``[daemon] shutdown_timeout_seconds`` by default: the grace a stopping daemon gives.
GRACE_SECONDS = 3.0


@pytest.mark.parametrize("how", ["SIGTERM", "POST /shutdown"])
def test_a_daemon_on_a_full_disk_stops_within_its_grace_and_a_restart_refuses_in_one_line(
    small_disk_repo: Path, how: str
) -> None:
    """Stopping needs no write (its goodbye event is best-effort); a start on the full
    disk says so in one line and exits non-zero; once space returns, nothing is lost."""
    root = small_disk_repo
    daemon = start_daemon(root)
    try:
        client = daemon.client()
        status, doc = post_task(client, "before")
        assert status == 201, doc
        filler = fill(root / ".grid")
        assert 507 in [post_task(client, f"during {n}")[0] for n in range(40)]
        if how == "SIGTERM":
            daemon.proc.send_signal(signal.SIGTERM)
        else:
            client._http.post("/shutdown")  # type: ignore[attr-defined]
        try:
            code = daemon.proc.wait(timeout=GRACE_SECONDS + 5)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{how} on a full disk did not stop the daemon: {daemon.stderr_text()}")
        assert code == 0
        said = (root / ".gridd-test-stderr").read_text()
        assert "Traceback" not in said and "Logging error" not in said, said
    finally:
        for c in daemon.clients:
            c.close()
        if daemon.proc.poll() is None:
            daemon.kill9()
    refused = run_gridd(root)
    assert refused.returncode != 0
    said = [line for line in (refused.stdout + refused.stderr).splitlines() if line.strip()]
    assert len(said) == 1, said
    assert "full" in said[0] and "start again" in said[0], said
    filler.unlink()
    with running_daemon(root) as again:
        titles = [t["title"] for t in again.client().get("/tasks")]
    assert titles == ["before"]


def test_a_damaged_wal_with_no_room_for_its_copy_is_a_one_line_refusal_not_a_half_copy(
    small_disk_repo: Path,
) -> None:
    """The copy of a damaged WAL is made before SQLite opens it (and drops its damaged
    frames). With no room for the copy the start refuses, leaving the WAL untouched and no
    partial copy; once there is room, the copy is made and the damage reported."""
    root = small_disk_repo
    grid = root / ".grid"
    daemon = start_daemon(root)
    try:
        client = daemon.client()
        for n in range(6):
            batch = [{"title": f"t{n}-{k}", "prompt": "x" * 20_000} for k in range(25)]
            client.post("/tasks", batch)
    finally:
        daemon.kill9()
    wal = grid / "gridd.db-wal"
    data = bytearray(wal.read_bytes())
    assert len(data) > 2 << 20, "the tasks should still be in the WAL"
    second_frame = 32 + (24 + 4096) + 24  # of the current log, whatever came after
    data[second_frame : second_frame + 64] = b"\xff" * 64
    wal.write_bytes(bytes(data))
    filler = fill(grid)
    os.truncate(filler, filler.stat().st_size - (3 << 19))  # 1.5 MiB free: less than the WAL
    refused = run_gridd(root)
    assert refused.returncode != 0
    said = [line for line in (refused.stdout + refused.stderr).splitlines() if line.strip()]
    assert len(said) == 1, said
    assert "no room to keep a copy" in said[0], said
    assert not list(grid.glob("gridd.db-wal.corrupt-*")), "a partial copy was left"
    assert wal.read_bytes() == bytes(data)
    filler.unlink()
    with running_daemon(root) as again:
        kinds = [e.data["kind"] for e in event_log(again.client(), types={"daemon.store_problem"})]
    assert "wal_garbled" in kinds, kinds
    (copy,) = grid.glob("gridd.db-wal.corrupt-*")
    assert copy.read_bytes() == bytes(data)


def _log(root: Path) -> list[dict[str, object]]:
    import sqlite3

    conn = sqlite3.connect(root / ".grid" / "gridd.db")
    try:
        rows = conn.execute("SELECT id, type, data FROM events ORDER BY id").fetchall()
    finally:
        conn.close()
    return [{"id": r[0], "type": r[1], "data": json.loads(r[2])} for r in rows]


async def test_agent_watcher_survives_a_state_database_that_cannot_be_written(
    repo: Path, tmp_path: Path
) -> None:
    """While every write to the state database fails as on a full disk (injected at the
    store, gridd's own seam), the agent's monitor waits instead of dying, and /health names
    it; once writes work again the agent's task moves on, and its output is still in its
    run file."""
    from typing import cast

    from gridd.errors import StoreError
    from gridd.grid import Grid
    from gridd.store import Store

    control = tmp_path / "control"
    control.mkdir()
    config = {
        "scheduler": {**FAST_SCHEDULER, "default_agent": "ticker"},
        "agents": {"ticker": {"command": agent_command("ticker.py", str(control), "0.02")}},
    }
    async with inprocess_daemon(repo, config) as d:
        grid = cast(Grid, d.grid)
        task = grid.commands.create_tasks([TaskSpec(title="talker")])[0]
        grid.commands.start_task(task.id)
        await until(lambda: (control / f"{task.id}.pid").exists(), timeout=30)
        await until(lambda: grid.bus.last_id > 0 and _outputs(grid) > 0, timeout=30)

        real_append = Store.append_event
        full = True

        def append_event(self: Store, *args: object, **kwargs: object) -> object:
            if full:
                raise StoreError("the disk holding the state database is full", code="disk_full")
            return real_append(self, *args, **kwargs)  # type: ignore[arg-type]

        Store.append_event = append_event  # type: ignore[assignment,method-assign]
        try:
            (control / f"{task.id}.go").touch()
            await until(lambda: (control / f"{task.id}.done").exists(), timeout=30)
            # The monitor meets the failing store: it waits, and /health says so.
            transport = httpx.AsyncHTTPTransport(uds=str(d.sock))
            async with httpx.AsyncClient(transport=transport, base_url="http://gridd") as http:
                deadline = time.monotonic() + 30
                while True:
                    health = (await http.get("/health")).json()
                    if any("watching paused" in w for w in health["warnings"]):
                        break
                    assert time.monotonic() < deadline, f"never reported: {health}"
                    await asyncio.sleep(0.05)
                assert health["status"] == "degraded"
                assert any("full" in w for w in health["warnings"])
            full = False
        finally:
            Store.append_event = real_append  # type: ignore[method-assign]
        await until(
            lambda: grid.state.tasks[task.id].status not in (TaskStatus.WORKING,), timeout=30
        )
        assert grid.state.tasks[task.id].status == TaskStatus.REVIEW
        run_files = list((repo / ".grid" / "runs").rglob("*"))
        text = "".join(p.read_text(errors="replace") for p in run_files if p.is_file())
        assert f"{task.id} last tick" in text


async def test_an_agent_whose_start_the_full_disk_would_not_record_is_watched_to_review(
    repo: Path, tmp_path: Path
) -> None:
    """The disk fills between the agent's process starting and its ``running`` record (the
    store refuses every write from then, as a full disk does): the start is not taken for a
    failure, the run is watched all the same, and once writes work again its exit is
    recorded and its work reaches review, on its one attempt, with no second run."""
    from typing import cast

    from gridd.errors import StoreError
    from gridd.grid import Grid
    from gridd.store import Store

    control = tmp_path / "control"
    control.mkdir()
    config = {
        "scheduler": {**FAST_SCHEDULER, "default_agent": "ticker"},
        "agents": {"ticker": {"command": agent_command("ticker.py", str(control), "0.02")}},
    }
    real = {name: getattr(Store, name) for name in ("append_event", "save_agent")}
    full = False

    def refusing(name: str):  # type: ignore[no-untyped-def]
        def write(self: Store, *args: object, **kwargs: object) -> object:
            if full:
                raise StoreError("the disk holding the state database is full", code="disk_full")
            return real[name](self, *args, **kwargs)

        return write

    async with inprocess_daemon(repo, config) as d:
        grid = cast(Grid, d.grid)
        executor = grid.pool.executor
        spawn = executor.spawn

        async def spawn_then_fill(launch: object) -> object:
            nonlocal full
            handle = await spawn(launch)  # type: ignore[arg-type]
            full = True  # the agent runs; nothing more can be written
            return handle

        executor.spawn = spawn_then_fill  # type: ignore[method-assign]
        for name in real:
            setattr(Store, name, refusing(name))
        try:
            task = grid.commands.create_tasks([TaskSpec(title="started as it filled")])[0]
            grid.commands.start_task(task.id)
            await until(lambda: full and (control / f"{task.id}.pid").exists(), timeout=30)
            (control / f"{task.id}.go").touch()
            await until(lambda: (control / f"{task.id}.done").exists(), timeout=30)
            transport = httpx.AsyncHTTPTransport(uds=str(d.sock))
            async with httpx.AsyncClient(transport=transport, base_url="http://gridd") as http:

                async def paused() -> bool:  # its monitor met the refusing store
                    health = (await http.get("/health")).json()
                    return any("watching paused" in w for w in health["warnings"])

                await until(paused, timeout=30, what="/health to say the watching paused")
            assert grid.state.tasks[task.id].status == TaskStatus.WORKING
            full = False
        finally:
            for name, method in real.items():
                setattr(Store, name, method)
        await until(
            lambda: grid.state.tasks[task.id].status != TaskStatus.WORKING,
            timeout=30,
            what="the task to leave working",
        )
        assert grid.state.tasks[task.id].status == TaskStatus.REVIEW
        assert grid.state.tasks[task.id].attempts == 1
        runs = [a for a in grid.state.agents.values() if a.task_id == task.id]
        assert len(runs) == 1, runs


def _outputs(grid: object) -> int:
    return sum(1 for a in grid.state.agents.values() if a.output_seq)  # type: ignore[attr-defined]


async def test_a_write_after_space_returns_is_taken_while_a_refused_one_still_waits(
    small_disk_repo: Path,
) -> None:
    """Queued writes the full disk refused wait for the writer's next try (up to a second
    apart); a write made once space is back goes in behind them at once, instead of being
    refused with the disk's old error until that try."""
    from gridd.errors import StoreError
    from gridd.store import Store

    grid = small_disk_repo / ".grid"
    store = Store.open(grid / "test.db")
    try:
        filler = fill(grid)
        with store.transaction(wait=False):  # queued: the writer keeps trying it
            store.set_meta("during", "x" * 200_000)
        await until(lambda: store.write_error is not None, timeout=10)
        # The disk still full: refused at once.
        with pytest.raises(StoreError), store.transaction(wait=False):
            store.set_meta("refused", "1")
        await asyncio.sleep(1.5)  # the writer's pause between tries is at its longest
        filler.unlink()
        with store.transaction(wait=False):
            store.set_meta("after", "1")
        await store.durable()
        assert store.get_meta("during") == "x" * 200_000
        assert store.get_meta("after") == "1"
        assert store.get_meta("refused") is None
        assert store.write_error is None
    finally:
        store.close()
