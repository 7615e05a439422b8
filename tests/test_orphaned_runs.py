"""No immortal orphans. A plain stop of the daemon leaves its agents running (their shims
outlive it, and the next daemon reattaches them); but a shim whose workspace's ``.grid/``
is deleted or replaced can never be reattached by anyone, so it stops its agent after
``scheduler.orphan_grace_seconds`` and exits. ``gridctl daemon stop --agents`` stops the
agents with the daemon, and says how many.

Real daemons, real shims, real agents (``tests/agents/hang.py``: its child ignores SIGTERM).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.support.cli import gridctl
from tests.support.daemons import core_daemon, running_daemon
from tests.support.processes import kill_workspace_agents, process_gone
from tests.support.repos import (
    agent_command,
    make_repo,
    read_json_file,
    remove_repo,
    write_core_config,
)
from tests.support.waits import wait_for

GRACE = 1.0


def _hang_config(repo: Path, pid_dir: Path) -> None:
    write_core_config(
        repo,
        agents={"hang": {"command": agent_command("hang.py", str(pid_dir))}},
        scheduler={
            "default_agent": "hang",
            "stop_when_idle": False,
            "orphan_grace_seconds": GRACE,
        },
    )


def _run_processes(c: object, pid_dir: Path, task_id: str) -> list[int]:
    """The pids of the task's run: its shim, its agent and the agent's child."""
    pids = wait_for(lambda: read_json_file(pid_dir / f"{task_id}.pids"), timeout=30)
    (agent,) = [a for a in c.get("/agents") if a["taskId"] == task_id]  # type: ignore[attr-defined]
    started = wait_for(lambda: read_json_file(Path(agent["runDir"]) / "agent.json"))
    return [int(started["shimPid"]), int(pids["agent"]), int(pids["child"])]


@pytest.mark.parametrize("fate", ["deleted", "replaced"])
def test_a_shim_whose_workspace_is_gone_stops_its_agent_and_exits(
    tmp_path: Path, fate: str
) -> None:
    repo, other = make_repo(), make_repo()
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        _hang_config(repo, tmp_path / "a")
        _hang_config(other, tmp_path / "b")
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        with core_daemon(other) as neighbour:
            nc = neighbour.client()
            nc.post("/tasks", {"id": "n", "title": "another workspace's agent"})
            nc.post("/session/start", {"maxAgents": 1})
            untouched = _run_processes(nc, tmp_path / "b", "n")
            # Not core_daemon: its teardown would kill what this test wants to see end.
            with running_daemon(repo) as daemon:
                c = daemon.client()
                c.post("/tasks", {"id": "o", "title": "orphaned"})
                c.post("/session/start", {"maxAgents": 1})
                orphaned = _run_processes(c, tmp_path / "a", "o")
                c.post("/shutdown")
                daemon.proc.wait(30)
            # A plain stop leaves the agent running, to be reattached by the next daemon.
            assert not any(process_gone(p) for p in orphaned)
            gone_at = time.monotonic()  # before: the shim may see it gone mid-way
            if fate == "deleted":
                shutil.rmtree(repo)
            else:  # another .grid/ in its place: same path, another directory
                (repo / ".grid").rename(tmp_path / "old-grid")
                (repo / ".grid").mkdir()
            wait_for(
                lambda: all(process_gone(p) for p in orphaned),
                timeout=GRACE + 10,
                message="the orphaned shim, its agent and the agent's child to be gone",
            )
            took = time.monotonic() - gone_at
            # Nothing else was touched: another workspace's run, an unrelated process.
            assert not any(process_gone(p) for p in untouched)
            assert bystander.poll() is None
            assert took >= GRACE, f"stopped after {took:.1f}s, inside the grace period"
    finally:
        kill_workspace_agents(repo)  # had the test failed: nothing left behind
        bystander.kill()
        bystander.wait()
        remove_repo(repo)
        remove_repo(other)


def test_daemon_stop_with_agents_stops_them_and_says_how_many(repo: Path, tmp_path: Path) -> None:
    _hang_config(repo, tmp_path)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", [{"id": "a", "title": "one"}, {"id": "b", "title": "two"}])
        c.post("/session/start", {"maxAgents": 2})
        runs = _run_processes(c, tmp_path, "a") + _run_processes(c, tmp_path, "b")
        done = gridctl(repo, "daemon", "stop", "--agents", timeout=60)
        assert done.returncode == 0, done.stderr
        assert "stopped 2 running agents" in done.stdout
        assert daemon.proc.wait(10) == 0
        assert all(process_gone(p) for p in runs)
    assert not [
        p.pid for p in psutil.process_iter() if p.pid in runs and p.status() != psutil.STATUS_ZOMBIE
    ]
