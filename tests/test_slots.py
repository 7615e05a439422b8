"""Slots are freed when an agent exits, before its work is committed, and that never loses
the work: a daemon killed in between commits it after its restart, with no second agent."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.api import wait_task_status
from tests.support.daemons import kill9_between_exit_and_commit, restartable_daemon
from tests.support.git import git
from tests.support.repos import write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for

#: Writes its work, then waits for a go file (outside the worktree) and exits 0.
WAITING_AGENT = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path('work.txt').write_text('work of ' + os.environ['GRID_TASK_ID'])\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
)


def test_a_daemon_killed_between_agent_exit_and_commit_loses_nothing(
    repo: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    write_core_config(
        repo, agents={"waiter": {"command": [sys.executable, "-c", WAITING_AGENT, str(go)]}}
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "kept", "title": "work to keep", "agent": "waiter"})
        c.post("/session/start", {"maxAgents": 1})
        agent = wait_for(lambda: c.get("/agents") and c.get("/agents")[0], timeout=30)
        worktree = Path(str(agent["worktreePath"]))
        kill9_between_exit_and_commit(grid, c, worktree, go, "kept")
        task = wait_task_status(c, "kept", "review", timeout=60)
        assert task["changedFiles"] == ["work.txt"]
        assert git(worktree, "status", "--porcelain").strip() == ""
        assert git(worktree, "show", "HEAD:work.txt").strip() == "work of kept"
        assert len(event_log(c, types={"agent.spawned"})) == 1
        assert len(event_log(c, types={"agent.completed"})) == 1
