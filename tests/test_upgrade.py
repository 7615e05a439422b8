"""``gridctl daemon upgrade``: the new code checks the state before anything stops, then
takes over with the agents still running (same pids), their output and events continuing;
a version that cannot use the state says so and stops nothing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

from gridd.cli.upgrade import classify, handover_problem
from tests.support.api import wait_task_status
from tests.support.cli import GRIDD, gridctl
from tests.support.daemons import restartable_daemon
from tests.support.processes import process_gone
from tests.support.repos import agent_command, read_json_file, touch, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for


def wait_pid(control: Path, task_id: str) -> int:
    return int(
        wait_for(
            lambda: (
                (control / f"{task_id}.pid").exists()
                and (control / f"{task_id}.pid").read_text().strip()
            ),
            timeout=20,
            message=f"{task_id}'s pid",
        )
    )


def test_upgrade_keeps_running_agents_and_their_output_and_events_continue(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        agents={"tick": {"command": agent_command("ticker.py", str(tmp_path), "0.05")}},
        scheduler={"default_agent": "tick"},
    )
    tids = ["v1", "v2"]
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", [{"id": t, "title": f"survives {t}"} for t in tids])
        c.post("/session/start", {"maxAgents": 2})
        pids = {t: wait_pid(tmp_path, t) for t in tids}
        agents = {a["taskId"]: a["id"] for a in c.get("/agents")}
        old_pid = c.get("/health")["pid"]
        assert c.get("/version")["handover"] == 1
        last_event = c.get("/state")["daemon"]["lastEventId"]

        result = gridctl(repo, "daemon", "upgrade", timeout=90)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "state check by gridd" in result.stdout
        assert "2 agent(s) kept running" in result.stdout

        assert c.get("/health")["pid"] != old_pid
        assert all(not process_gone(p) for p in pids.values())
        assert {a["taskId"]: a["pid"] for a in c.get("/agents")} == pids
        # Output keeps arriving in the new daemon's events, after the handover.
        for t in tids:
            seq = c.get(f"/agents/{agents[t]}")["outputSeq"]
            wait_for(
                lambda t=t, seq=seq: c.get(f"/agents/{agents[t]}")["outputSeq"] > seq,
                timeout=20,
                message=f"{t}'s output to continue",
            )
        fresh = [e for e in event_log(c, types={"agent.output"}) if (e.id or 0) > last_event]
        assert {e.data["agentId"] for e in fresh} >= set(agents.values())
        for t in tids:
            touch(tmp_path / f"{t}.go")
        for t in tids:
            wait_task_status(c, t, "review")
            done = read_json_file(tmp_path / f"{t}.done")
            assert done is not None
        completed = event_log(c, types={"agent.completed"})
        assert {e.data["taskId"] for e in completed} == set(tids)
        assert len(event_log(c, types={"agent.spawned"})) == 2  # nothing ran twice


def test_upgrade_refuses_before_stopping_anything_when_the_state_is_too_new(
    repo: Path,
) -> None:
    with restartable_daemon(repo) as grid:
        c = grid.client()
        old_pid = c.get("/health")["pid"]
        with sqlite3.connect(repo / ".grid" / "gridd.db") as db:
            db.execute("PRAGMA user_version = 99")
        result = gridctl(repo, "daemon", "upgrade", timeout=60)
        assert result.returncode == 1
        assert "schema 99" in result.stderr
        assert "Nothing was stopped" in result.stderr
        assert c.get("/health")["pid"] == old_pid


def test_check_state_reads_without_writing_and_reports_the_schema(repo: Path) -> None:
    with restartable_daemon(repo):
        result = subprocess.run(
            [*GRIDD, "--check-state", "--workspace", str(repo)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["readable"] is True
    assert report["schema"] == report["supported_schema"]
    assert report["integrity"] == "ok"
    assert 1 in report["adopts"]


def test_a_version_that_cannot_adopt_the_shims_says_why() -> None:
    assert handover_problem(None, [1]) is None  # daemons before the field: format 1
    assert handover_problem(1, [1, 2]) is None
    problem = handover_problem(1, [2])
    assert problem is not None and "orphaned" in problem


def test_agents_are_classified_kept_finished_or_lost() -> None:
    before = {"a": {"pid": 10}, "b": {"pid": 11}, "c": {"pid": 12}, "d": {"pid": 13}}
    after = {
        "a": {"pid": 10, "status": "running"},
        "b": {"pid": 11, "status": "exited"},
        "c": {"pid": 99, "status": "running"},
    }
    assert classify(before, after) == (["a"], ["b"], ["c", "d"])
