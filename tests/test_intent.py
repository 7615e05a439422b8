"""Intent goes through state: the API records what is wanted, the reconciler does it. A
daemon killed (SIGKILL, at the ``intent.recorded`` crash point) between the request and the
act still carries the request out after a restart."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gridd.errors import DaemonUnreachable
from tests.support.api import wait_task_status
from tests.support.daemons import restartable_daemon
from tests.support.processes import process_gone
from tests.support.repos import agent_command, read_text_file, write_core_config
from tests.support.sse import wait_for_events
from tests.support.waits import wait_for


def _config(repo: Path, tmp_path: Path, *, crash: bool) -> None:
    write_core_config(
        repo,
        agents={"slow": {"command": agent_command("stubborn.py", str(tmp_path), "ignore")}},
        scheduler={"default_agent": "slow", "stop_grace_seconds": 1.0},
    )
    if crash:
        with (repo / ".grid" / "config.toml").open("a") as fh:
            fh.write('\n[daemon]\ncrash_points = ["intent.recorded"]\n')


def _killed_by_its_request(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((DaemonUnreachable, httpx.TransportError)):
        call()


def test_a_kill_recorded_just_before_a_kill_9_is_carried_out_after_restart(
    repo: Path, tmp_path: Path
) -> None:
    _config(repo, tmp_path, crash=True)
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "victim", "title": "runs until killed"})
        c.post("/session/start", {"maxAgents": 1})
        pid = int(wait_for(lambda: read_text_file(tmp_path / "victim.pid"), timeout=30))
        agent_id = c.get("/agents")[0]["id"]
        _killed_by_its_request(lambda: c.post(f"/agents/{agent_id}/kill"))
        assert grid.daemon is not None
        grid.daemon.proc.wait(10)
        assert not process_gone(pid), "the kill was carried out before the daemon died"
        _config(repo, tmp_path, crash=False)
        grid.start()
        # Its agent ignores SIGTERM: only the recorded kill (SIGKILL) ends it.
        wait_for(lambda: process_gone(pid), timeout=20, message="the agent to be killed")
        stopped = wait_for_events(c, {"agent.stopped"}, 1)[0]
        assert stopped.data["reason"] == "killed by user"
        task = wait_task_status(c, "victim", "blocked")
        assert task["statusReason"] == "agent killed by user"
        agent = next(a for a in c.get("/agents", params={"all": "1"}) if a["id"] == agent_id)
        assert agent["status"] == "exited" and agent["intent"] == "kill"


def test_a_task_stop_recorded_just_before_a_kill_9_is_carried_out_after_restart(
    repo: Path, tmp_path: Path
) -> None:
    _config(repo, tmp_path, crash=True)
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "halt", "title": "runs until stopped"})
        c.post("/session/start", {"maxAgents": 1})
        pid = int(wait_for(lambda: read_text_file(tmp_path / "halt.pid"), timeout=30))
        _killed_by_its_request(lambda: c.post("/tasks/halt/stop"))
        assert grid.daemon is not None
        grid.daemon.proc.wait(10)
        assert not process_gone(pid)
        _config(repo, tmp_path, crash=False)
        grid.start()
        # SIGTERM first (it is noted and ignored), SIGKILL after stop_grace_seconds.
        wait_for(lambda: read_text_file(tmp_path / "halt.term"), timeout=20)
        wait_for(lambda: process_gone(pid), timeout=20, message="the agent to be stopped")
        stopped = wait_for_events(c, {"agent.stopped"}, 1)[0]
        assert stopped.data["reason"] == "task stopped by user"
        # Stopped, not cancelled: the session still runs, so the task is scheduled again.
        agents = c.get("/agents", params={"all": "1"})
        first = next(a for a in agents if a["id"] == stopped.data["agentId"])
        assert first["status"] == "exited" and first["intent"] == "stop"
