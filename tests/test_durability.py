"""Nothing is lost when the daemon goes away: agents run on under their supervisor, and a
new daemon picks up their output, their exit status and the event stream where the old one
left off. Real daemons, real kills, real agent processes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from gridd.client import GridClient, SSEEvent
from gridd.runs.process import AgentProcess, process_create_time
from tests.support.api import output_chunks, wait_task_status
from tests.support.cli import gridctl
from tests.support.daemons import restartable_daemon
from tests.support.git import git
from tests.support.processes import open_fds, process_gone, zombie_children
from tests.support.repos import AGENTS_DIR, agent_command, read_json_file, touch, write_core_config
from tests.support.sse import EventFollower, event_log, wait_for_events
from tests.support.waits import wait_for

sys.path.insert(0, str(AGENTS_DIR))
from bigwrite import expected_output

sys.path.remove(str(AGENTS_DIR))


def wait_pid(control: Path, task_id: str) -> int:
    text = wait_for(
        lambda: (control / f"{task_id}.pid").exists() and (control / f"{task_id}.pid").read_text(),
        timeout=30,
        message=f"{task_id} to start",
    )
    return int(text)


def agent_of(c: GridClient, task_id: str) -> dict[str, object]:
    agents = [a for a in c.get("/agents", params={"all": "1"}) if a["taskId"] == task_id]
    assert agents, f"no agent for {task_id}"
    return agents[-1]


def assert_exactly_once(events: Sequence[SSEEvent], full_log: Sequence[SSEEvent]) -> None:
    """The followed stream holds every logged event, each once, in id order."""
    ids = [e.id for e in events]
    assert ids == sorted(set(ids)), "event ids repeat or go backwards"
    assert [(e.id, e.type) for e in events] == [(e.id, e.type) for e in full_log]


def output_by_agent(events: Sequence[SSEEvent]) -> dict[str, list[SSEEvent]]:
    by_agent: dict[str, list[SSEEvent]] = {}
    for e in events:
        if e.type == "agent.output":
            by_agent.setdefault(e.data["agentId"], []).append(e)
    return by_agent


# -- kill -9 while agents run -------------------------------------------------------------------


def test_agents_outlive_a_kill_9_and_a_resuming_client_misses_nothing(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        agents={"tick": {"command": agent_command("ticker.py", str(tmp_path), "0.03")}},
        scheduler={"default_agent": "tick"},
    )
    tids = ["k1", "k2", "k3"]
    with restartable_daemon(repo) as grid, EventFollower(grid.sock) as follower:
        c = grid.client()
        c.post("/tasks", [{"id": t, "title": f"tick {t}"} for t in tids])
        c.post("/session/start", {"featureBranch": "feature/k9", "maxAgents": 3})
        pids = {t: wait_pid(tmp_path, t) for t in tids}
        agents = {t: agent_of(c, t) for t in tids}
        follower.wait(
            lambda evs: len(output_by_agent(evs)) == 3,
            message="output from all three agents",
        )

        grid.kill9()
        seen_at_kill = follower.last_id
        time.sleep(1.5)  # the agents keep writing while no daemon watches
        assert all(not process_gone(p) for p in pids.values())
        ticks_while_down = {
            t: (Path(str(agents[t]["runDir"])) / "output.log").read_text().count("tick")
            for t in tids
        }

        grid.start()
        reattached = wait_for_events(c, {"agent.reattached"}, 3)
        assert {e.data["taskId"]: e.data["pid"] for e in reattached} == pids
        assert all(e.data["alive"] and not e.data["exited"] for e in reattached)
        for t in tids:
            touch(tmp_path / f"{t}.go")
        for t in tids:
            task = wait_task_status(c, t, "review")
            assert task["changedFiles"] == [f"{t}.txt"]
            assert git(repo, "show", f"grid/{t}:{t}.txt") == f"work for {t}\n"
        last = int(c.get("/state")["daemon"]["lastEventId"])
        follower.wait(lambda evs: evs and evs[-1].id >= last, message=f"event {last}")
        followed = [e for e in follower.snapshot() if e.id is not None and e.id <= last]
        full_log = [e for e in event_log(c) if e.id <= last]
        served = {t: output_chunks(c, str(agents[t]["id"])) for t in tids}

    assert follower.connections >= 2  # it did resume
    assert_exactly_once(followed, full_log)
    assert any(e.type == "agent.output" for e in followed if e.id > seen_at_kill)
    spawned = [e for e in followed if e.type == "agent.spawned"]
    assert sorted(e.data["taskId"] for e in spawned) == tids  # nothing ran twice
    assert sorted(e.data["taskId"] for e in followed if e.type == "agent.completed") == tids
    for t in tids:
        agent_id = str(agents[t]["id"])
        chunks = output_by_agent(followed)[agent_id]
        assert [e.data["seq"] for e in chunks] == list(range(1, len(chunks) + 1))
        text = "".join(e.data["chunk"] for e in chunks)
        assert text == (Path(str(agents[t]["runDir"])) / "output.log").read_text()
        assert text == "".join(str(ch["chunk"]) for ch in served[t])
        lines = text.splitlines()
        done = int(lines[-1].rsplit(" ", 1)[1])
        assert lines == [f"{t} tick {n}" for n in range(1, done + 1)] + [f"{t} last tick {done}"]
        assert done >= ticks_while_down[t]


def test_an_agent_that_exits_while_the_daemon_is_down_gets_its_real_exit_status(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        agents={
            "ok": {"command": agent_command("ticker.py", str(tmp_path), "0.05", "0")},
            "bad": {"command": agent_command("ticker.py", str(tmp_path), "0.05", "9")},
        },
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post(
            "/tasks",
            [
                {"id": "fine", "title": "exits 0", "agent": "ok"},
                {"id": "broken", "title": "exits 9", "agent": "bad", "maxAttempts": 1},
            ],
        )
        c.post("/session/start", {"maxAgents": 2})
        for t in ("fine", "broken"):
            wait_pid(tmp_path, t)
        run_dirs = {t: Path(str(agent_of(c, t)["runDir"])) for t in ("fine", "broken")}

        grid.kill9()
        for t in ("fine", "broken"):
            touch(tmp_path / f"{t}.go")
        exits = {
            t: wait_for(lambda d=d: read_json_file(d / "exit.json"), timeout=20)
            for t, d in run_dirs.items()
        }
        assert exits["fine"]["exitCode"] == 0
        assert exits["broken"]["exitCode"] == 9

        grid.start()
        assert wait_task_status(c, "fine", "review")["changedFiles"] == ["fine.txt"]
        broken = wait_task_status(c, "broken", "failed")
        assert "exited with code 9" in str(broken["error"])
        failed = [e.data for e in event_log(c, types={"agent.failed"})]
        assert [(f["taskId"], f["exitCode"], f["willRetry"]) for f in failed] == [
            ("broken", 9, False)
        ]
        assert agent_of(c, "broken")["exitCode"] == 9
        assert agent_of(c, "fine")["exitCode"] == 0
        # Its last words, written while nobody watched, are in its output.
        text = "".join(
            str(ch["chunk"]) for ch in output_chunks(c, str(agent_of(c, "broken")["id"]))
        )
        assert "broken last tick" in text
        assert len(event_log(c, types={"agent.spawned"})) == 2


def test_ten_megabytes_written_while_the_daemon_is_stopped_never_block_and_all_arrive(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo, agents={"big": {"command": agent_command("bigwrite.py", str(tmp_path), "10")}}
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "big", "title": "ten megabytes", "agent": "big"})
        c.post("/session/start", {"maxAgents": 1})
        pid = wait_pid(tmp_path, "big")
        run_dir = Path(str(agent_of(c, "big")["runDir"]))

        grid.stop()  # a clean stop: the agent must outlive it too
        stopped_at = time.time()
        touch(tmp_path / "big.go")
        done = wait_for(lambda: read_json_file(tmp_path / "big.done"), timeout=20)
        ended = wait_for(lambda: read_json_file(run_dir / "exit.json"), timeout=20)
        time.sleep(max(0.0, stopped_at + 10 - time.time()))  # the daemon stays away 10 s
        restarted_at = time.time()
        assert done["at"] < restarted_at and ended["endedAt"] < restarted_at
        assert ended["exitCode"] == 0 and process_gone(pid)

        grid.start()
        wait_task_status(c, "big", "review", timeout=60)
        chunks = output_chunks(c, str(agent_of(c, "big")["id"]), limit=500)

    expected = expected_output(10)
    assert done["bytes"] == len(expected) == (run_dir / "output.log").stat().st_size
    assert [ch["seq"] for ch in chunks] == list(range(1, len(chunks) + 1))
    text = "".join(str(ch["chunk"]) for ch in chunks)
    want = expected.decode("utf-8", errors="replace")
    assert len(text) == len(want)
    assert hashlib.sha256(text.encode()).hexdigest() == hashlib.sha256(want.encode()).hexdigest()


def rewrite_agent(repo: Path, agent_id: str, **fields: object) -> None:
    """Edit an agent's stored record while no daemon runs (what a stale record looks like)."""
    with contextlib.closing(sqlite3.connect(repo / ".grid" / "gridd.db")) as db:
        row = db.execute("SELECT doc FROM agents WHERE id = ?", (agent_id,)).fetchone()
        doc = {**json.loads(row[0]), **fields}
        db.execute("UPDATE agents SET doc = ? WHERE id = ?", (json.dumps(doc), agent_id))
        db.commit()


# -- process identity ----------------------------------------------------------------------------


def test_a_pid_reused_by_an_unrelated_process_is_never_signalled(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        real = process_create_time(sleeper.pid)
        assert real is not None
        # What a handle looks like when its agent died and the pid went to someone else.
        stale = AgentProcess(
            tmp_path,
            sleeper.pid,
            real - 3600,
            shim_pid=sleeper.pid,
            shim_create_time=real - 3600,
        )
        assert not stale.alive()
        assert not stale.group_alive()
        assert not stale.shim_alive()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            assert stale.signal(sig) is False
        # A handle without a create time is never trusted either.
        assert AgentProcess(tmp_path, sleeper.pid, None).signal(signal.SIGKILL) is False
        time.sleep(0.2)
        assert sleeper.poll() is None, "the unrelated process was signalled"
        # The genuine identity is signalled.
        genuine = AgentProcess(tmp_path, sleeper.pid, real)
        assert genuine.alive()
        assert genuine.signal(signal.SIGKILL) is True
        assert sleeper.wait(5) == -signal.SIGKILL
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_a_restarted_daemon_never_signals_a_process_that_took_a_dead_agents_pid(
    repo: Path, tmp_path: Path
) -> None:
    """An agent and its supervisor died with the daemon; their pids now belong to others."""
    write_core_config(
        repo, agents={"tick": {"command": agent_command("ticker.py", str(tmp_path), "0.05")}}
    )
    sleepers: list[subprocess.Popen[bytes]] = []
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "gone", "title": "dies with the daemon", "agent": "tick"})
        c.post("/session/start", {"maxAgents": 1})
        wait_pid(tmp_path, "gone")
        agent = agent_of(c, "gone")
        grid.kill9()
        os.kill(int(str(agent["shimPid"])), signal.SIGKILL)
        os.killpg(int(str(agent["pid"])), signal.SIGKILL)
        wait_for(lambda: process_gone(int(str(agent["pid"]))), timeout=10)
        # Stand-ins for the processes that got the pids: we cannot choose a pid, so the
        # record is rewritten to name live strangers with the dead agent's create times.
        for _ in range(2):
            sleepers.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
        rewrite_agent(repo, str(agent["id"]), pid=sleepers[0].pid, shim_pid=sleepers[1].pid)
        (Path(str(agent["runDir"])) / "exit.json").unlink(missing_ok=True)

        grid.start()
        failed = wait_for_events(c, {"agent.failed"}, 1)
        assert failed[0].data["agentId"] == agent["id"]
        assert "supervisor died" in failed[0].data["error"]
        c.post("/session/stop", params={"force": "1"})
        time.sleep(0.5)
        assert all(s.poll() is None for s in sleepers), "a stranger was signalled"
    for s in sleepers:
        s.kill()
        s.wait()


# -- a daemon that dies at an awkward moment -----------------------------------------------------


def test_an_agent_recorded_as_starting_when_the_daemon_died_is_adopted_not_run_twice(
    repo: Path, tmp_path: Path
) -> None:
    """The daemon died after recording the agent but before its shim reported the pids."""
    write_core_config(
        repo, agents={"tick": {"command": agent_command("ticker.py", str(tmp_path), "0.05")}}
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "early", "title": "half-recorded", "agent": "tick"})
        c.post("/session/start", {"maxAgents": 1})
        pid = wait_pid(tmp_path, "early")
        agent = agent_of(c, "early")
        grid.kill9()
        rewrite_agent(
            repo,
            str(agent["id"]),
            status="starting",
            pid=None,
            create_time=None,
            shim_pid=None,
            shim_create_time=None,
        )
        grid.start()
        reattached = wait_for_events(c, {"agent.reattached"}, 1)[0].data
        assert (reattached["pid"], reattached["alive"]) == (pid, True)
        assert c.get(f"/agents/{agent['id']}")["status"] == "running"
        touch(tmp_path / "early.go")
        wait_task_status(c, "early", "review")
        assert len(event_log(c, types={"agent.spawned"})) == 1
        assert not event_log(c, types={"agent.failed"})


def test_a_daemon_stopped_while_committing_an_agents_work_finishes_it_after_restart(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(repo, agents={"many": {"command": agent_command("manyfiles.py", "3000")}})
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "bulky", "title": "slow to commit", "agent": "many"})
        c.post("/session/start", {"maxAgents": 1})
        run_dir = Path(str(wait_for(lambda: c.get("/agents") and c.get("/agents")[0])["runDir"]))
        wait_for(lambda: (run_dir / "exit.json").exists(), timeout=60, interval=0.01)
        grid.stop()  # most likely in the middle of 'git add' / 'git commit'
        grid.start()
        task = wait_task_status(c, "bulky", "review", timeout=60)
        assert len(task["changedFiles"]) == 3000
        assert len(event_log(c, types={"agent.spawned"})) == 1
        assert len(event_log(c, types={"agent.completed"})) == 1
        assert git(repo, "-C", str(task["worktree"]), "status", "--porcelain") == ""


def test_output_events_have_no_gap_when_the_daemon_is_killed_mid_flood(
    repo: Path, tmp_path: Path
) -> None:
    """However the kill falls between indexing output and publishing it, every chunk is
    published once after the restart."""
    write_core_config(
        repo, agents={"flood": {"command": agent_command("flood.py", "30", str(tmp_path))}}
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "flood", "title": "floods", "agent": "flood"})
        c.post("/session/start", {"maxAgents": 1})
        run_dir = wait_for(lambda: c.get("/agents") and Path(c.get("/agents")[0]["runDir"]))
        index = run_dir / "chunks.idx"
        # Killed just after an index write: while that batch's events are being published.
        wait_for(lambda: index.exists() and index.stat().st_size > 16 * 40, interval=0.001)
        grid.kill9()
        grid.start()
        wait_task_status(c, "flood", "review", timeout=60)
        agent = agent_of(c, "flood")
        chunks = [e.data for e in event_log(c, types={"agent.output"})]
    assert [ch["seq"] for ch in chunks] == list(range(1, len(chunks) + 1))
    text = "".join(ch["chunk"] for ch in chunks)
    assert text.encode() == (Path(str(agent["runDir"])) / "output.log").read_bytes()


# -- an upgrade: gridctl daemon restart -----------------------------------------------------------


def test_gridctl_daemon_restart_keeps_every_agent_running(repo: Path, tmp_path: Path) -> None:
    write_core_config(
        repo,
        agents={"tick": {"command": agent_command("ticker.py", str(tmp_path), "0.1")}},
        scheduler={"default_agent": "tick"},
    )
    tids = ["u1", "u2", "u3"]
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", [{"id": t, "title": f"survives {t}"} for t in tids])
        c.post("/session/start", {"maxAgents": 3})
        pids = {t: wait_pid(tmp_path, t) for t in tids}
        old_pid = c.get("/health")["pid"]
        # How fast it comes back (the 2 s promise) is bench/bench_durability.py's to measure.
        result = gridctl(repo, "--workspace", str(repo), "daemon", "restart", timeout=60)
        assert result.returncode == 0, result.stderr
        health = c.get("/health")
        assert health["pid"] != old_pid
        assert all(not process_gone(p) for p in pids.values())
        reattached = wait_for_events(c, {"agent.reattached"}, 3)
        assert {e.data["taskId"]: e.data["pid"] for e in reattached} == pids
        assert {a["taskId"]: a["pid"] for a in c.get("/agents")} == pids
        for t in tids:
            touch(tmp_path / f"{t}.go")
        for t in tids:
            wait_task_status(c, t, "review")
        assert len(event_log(c, types={"agent.spawned"})) == 3
        assert not event_log(c, types={"agent.failed", "agent.stopped"})


# -- damaged and unexpected state on disk ---------------------------------------------------------


def test_a_corrupt_run_directory_is_reported_and_its_files_are_kept(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo, agents={"tick": {"command": agent_command("ticker.py", str(tmp_path), "0.02")}}
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "mangled", "title": "run dir damaged", "agent": "tick"})
        c.post("/session/start", {"maxAgents": 1})
        wait_pid(tmp_path, "mangled")
        agent = agent_of(c, "mangled")
        run_dir = Path(str(agent["runDir"]))
        wait_for(lambda: len(output_chunks(c, str(agent["id"]))) >= 5)
        grid.kill9()
        touch(tmp_path / "mangled.go")
        wait_for(lambda: read_json_file(run_dir / "exit.json"), timeout=20)
        log_bytes = (run_dir / "output.log").read_bytes()
        (run_dir / "exit.json").write_text('{"exitCode": 0, "sig')  # torn
        (run_dir / "agent.json").write_bytes(b"\x00\xff garbage")
        index = run_dir / "chunks.idx"
        index.write_bytes(index.read_bytes()[:-20])  # the last record torn, one more lost

        grid.start()
        failed = wait_for_events(c, {"agent.failed"}, 1)[0].data
        assert failed["agentId"] == agent["id"]
        assert "exit.json is unreadable" in failed["error"]
        warnings = [e.data["warning"] for e in event_log(c, types={"agent.warning"})]
        assert any("output index" in w for w in warnings), warnings
        # Nothing was deleted or rewritten: the evidence is all still there.
        assert (run_dir / "exit.json").read_text() == '{"exitCode": 0, "sig'
        assert (run_dir / "agent.json").read_bytes() == b"\x00\xff garbage"
        assert (run_dir / "output.log").read_bytes() == log_bytes
        assert "mangled last tick" in (run_dir / "failure.md").read_text()
        # The output can still be read, and no seq went to two different chunks.
        seqs = [
            e.data["seq"]
            for e in event_log(c, types={"agent.output"})
            if e.data["agentId"] == agent["id"]
        ]
        assert len(seqs) == len(set(seqs))
        assert output_chunks(c, str(agent["id"]))
        # The retry ran (the ticker finds its .go file and finishes at once).
        wait_task_status(c, "mangled", "review")


def test_an_agent_whose_supervisor_died_is_watched_until_it_exits_and_never_doubled(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo, agents={"tick": {"command": agent_command("ticker.py", str(tmp_path), "0.05")}}
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "orphan", "title": "loses its shim", "agent": "tick"})
        c.post("/session/start", {"maxAgents": 1})
        pid = wait_pid(tmp_path, "orphan")
        agent = agent_of(c, "orphan")
        os.kill(int(str(agent["shimPid"])), signal.SIGKILL)
        warning = wait_for_events(c, {"agent.warning"}, 1)[0].data
        assert "supervisor died" in warning["warning"]
        time.sleep(0.5)
        assert not process_gone(pid)  # left to work
        assert len(event_log(c, types={"agent.spawned"})) == 1  # and not doubled
        touch(tmp_path / "orphan.go")
        failed = wait_for_events(c, {"agent.failed"}, 1)[0].data
        assert "supervisor died" in failed["error"] and failed["willRetry"]
        assert process_gone(pid)
        wait_task_status(c, "orphan", "review")
        assert len(event_log(c, types={"agent.spawned"})) == 2


def test_missing_and_orphaned_worktrees_are_reported_repaired_and_never_deleted(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo, agents={"tick": {"command": agent_command("ticker.py", str(tmp_path), "0.05")}}
    )
    stray = repo / ".grid" / "worktrees" / "stray"
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "lost", "title": "loses its worktree", "agent": "tick"})
        c.post("/session/start", {"maxAgents": 1})
        wait_pid(tmp_path, "lost")
        c.post("/session/stop", params={"force": "1"})
        task = wait_task_status(c, "lost", "ready")
        wait_for(lambda: not c.get("/agents"))
        worktree = Path(str(task["worktree"]))
        assert git(repo, "show", "grid/lost:lost.txt") == "work for lost\n"  # committed
        grid.stop()

        subprocess.run(["rm", "-rf", str(worktree)], check=True)
        git(repo, "worktree", "add", "-q", "-b", "stray-branch", str(stray))
        (stray / "precious.txt").write_text("uncommitted work nobody tracks\n")
        (tmp_path / "lost.pid").unlink()

        grid.start()
        missing = wait_for_events(c, {"worktree.missing"}, 1)[0].data
        assert (missing["taskId"], missing["path"]) == ("lost", str(worktree))
        assert "re-created" in missing["action"]
        orphaned = wait_for_events(c, {"worktree.orphaned"}, 1)[0].data
        assert (orphaned["path"], orphaned["dirty"], orphaned["action"]) == (
            str(stray),
            True,
            "kept",
        )
        # The task runs again in a worktree re-created from its branch, work included.
        c.post("/session/start", {"maxAgents": 1})
        wait_pid(tmp_path, "lost")
        assert (worktree / ".git").exists()
        assert "work in progress" in git(repo, "-C", str(worktree), "log", "--format=%s")
        touch(tmp_path / "lost.go")
        wait_task_status(c, "lost", "review")
    assert (stray / "precious.txt").read_text() == "uncommitted work nobody tracks\n"
    assert "stray-branch" in git(repo, "branch", "--list", "stray-branch")


# -- long runs leak nothing ------------------------------------------------------------------------


def test_two_hundred_tasks_leave_no_open_descriptors_and_no_zombies(repo: Path) -> None:
    write_core_config(
        repo,
        agents={"quick": {"command": ["sh", "-c", 'echo "done with $GRID_TASK_ID"']}},
        scheduler={"default_agent": "quick", "max_agents": 8},
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        pid = int(c.get("/health")["pid"])
        baseline = open_fds(pid)
        c.post("/tasks", [{"id": f"n{i:03d}", "title": f"quick {i}"} for i in range(200)])
        c.post("/session/start", {"maxAgents": 8})
        wait_for(
            lambda: c.get("/state")["stats"]["review"] == 200,
            timeout=180,
            interval=0.5,
            message="200 tasks in review",
        )
        assert not c.get("/agents")
        assert len(event_log(c, types={"agent.completed"})) == 200
        # Descriptors come back to where they were; every child was reaped.
        wait_for(lambda: abs(open_fds(pid) - baseline) <= 5, timeout=15, message="fds")
        assert zombie_children(pid) == []
        assert [p.pid for p in psutil.Process(pid).children(recursive=True)] == []


def test_a_git_lock_while_finishing_is_waited_out_and_a_stuck_one_parks_the_task(
    repo: Path, tmp_path: Path
) -> None:
    """Say an earlier daemon's 'git add' is still running: its lock is transient. A lock that
    never goes away parks the task for a human; its agent is not run again."""
    write_core_config(
        repo,
        agents={"tick": {"command": agent_command("ticker.py", str(tmp_path), "0.05")}},
        scheduler={"default_agent": "tick"},
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post(
            "/tasks",
            [{"id": "brief", "title": "lock goes"}, {"id": "stuck", "title": "lock stays"}],
        )
        c.post("/session/start", {"maxAgents": 2})
        locks = {}
        for t in ("brief", "stuck"):
            wait_pid(tmp_path, t)
            locks[t] = repo / ".git" / "worktrees" / t / "index.lock"
            touch(locks[t])
            touch(tmp_path / f"{t}.go")
        time.sleep(1.5)
        assert c.get("/tasks/brief")["status"] == "working"  # waiting for the lock
        locks["brief"].unlink()
        task = wait_task_status(c, "brief", "review", timeout=20)
        assert task["changedFiles"] == ["brief.txt"]
        stuck = wait_task_status(c, "stuck", "blocked", timeout=30)
        assert "could not record the agent's work" in str(stuck["error"])
        failed = [e.data for e in event_log(c, types={"agent.finish_failed"})]
        assert [f["taskId"] for f in failed] == ["stuck"]
        assert len(event_log(c, types={"agent.spawned"})) == 2
        assert not c.get("/agents")
        assert (repo / ".grid" / "worktrees" / "stuck" / "stuck.txt").exists()  # kept
        locks["stuck"].unlink()
