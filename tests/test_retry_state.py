"""Retry state is persisted with the task: a restarted daemon keeps a failed task's backoff
deadline and its count of recent failures (the flapping guard), as well as its attempts."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tests.support.api import wait_task_status
from tests.support.daemons import restartable_daemon
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import wait_for_events
from tests.support.waits import wait_for


def _time(value: object) -> datetime:
    assert isinstance(value, str)
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_a_backoff_deadline_survives_a_kill_9(repo: Path) -> None:
    write_core_config(
        repo,
        agents={"fail": {"command": agent_command("fail.py", "3")}},
        scheduler={
            "default_agent": "fail",
            "backoff_seconds": 4.0,
            "backoff_max_seconds": 4.0,
            "flap_failures": 10,
        },
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "wobbly", "title": "fails", "maxAttempts": 5})
        c.post("/session/start", {"maxAgents": 1})
        wait_for_events(c, {"agent.failed"}, 1)
        task = wait_for(
            lambda: (t := c.get("/tasks/wobbly"))["backoffUntil"] and t["status"] == "ready" and t
        )
        until = _time(task["backoffUntil"])
        assert task["attempts"] == 1 and len(task["failureTimes"]) == 1
        grid.kill9()
        grid.start()
        # The next attempt waits for the persisted deadline, not for a fresh daemon's whim.
        spawns = wait_for_events(c, {"agent.spawned"}, 2)
        assert spawns[1].data["attempt"] == 2
        second = next(
            a for a in c.get("/agents", params={"all": "1"}) if a["id"] == spawns[1].data["agentId"]
        )
        assert _time(second["startedAt"]) >= until
        c.post("/session/stop", params={"force": "1"})


def test_the_flap_count_survives_a_restart(repo: Path) -> None:
    write_core_config(
        repo,
        agents={"fail": {"command": agent_command("fail.py", "3")}},
        scheduler={"default_agent": "fail", "flap_failures": 2, "flap_window_seconds": 600},
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "flappy", "title": "fails", "maxAttempts": 10})
        c.post("/session/start", {"maxAgents": 1})
        wait_for_events(c, {"agent.failed"}, 1)
        grid.stop()  # between its first and second failure
        grid.start()
        task = wait_task_status(c, "flappy", "failed")
        # Without the persisted failure times the new daemon would have counted one, and
        # retried: 10 attempts allowed, only 2 used.
        assert task["attempts"] == 2
        assert "flapping: 2 failures" in str(task["error"])
        assert len(task["failureTimes"]) == 2
