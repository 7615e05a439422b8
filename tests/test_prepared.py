"""Prepared worktrees (``gridd/git/prepared.py``): the next tasks' worktrees are made while
the slots are busy, and a prepared worktree never costs a stale base, a lost commit or a
second start. The decision is tested as a pure function; the rest on a real daemon, real git
and real agent processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gridd.git.prepared import keeps, worth_preparing
from gridd.model import Task, TaskStatus
from tests.helpers import (
    core_daemon,
    event_log,
    kill9_between_exit_and_commit,
    restartable_daemon,
    wait_for,
    wait_task_status,
    write_core_config,
)

#: Writes ``<task>.txt``, then waits for a go file (outside the worktree) and exits 0.
WAITING_AGENT = (
    "import os, pathlib, sys, time\n"
    "task = os.environ['GRID_TASK_ID']\n"
    "pathlib.Path(task + '.txt').write_text('work of ' + task)\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
)
FEATURE = "feature/prep"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def has_branch(repo: Path, branch: str) -> bool:
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"],
        cwd=repo,
        capture_output=True,
    )
    return found.returncode == 0


def waiting_config(repo: Path, go: Path) -> None:
    write_core_config(
        repo,
        agents={"waiter": {"command": [sys.executable, "-c", WAITING_AGENT, str(go)]}},
        scheduler={"default_agent": "waiter"},
    )


def prepared(repo: Path, task_id: str) -> Path:
    path = repo / ".grid" / "worktrees" / task_id
    wait_for(
        lambda: (path / ".git").exists() and has_branch(repo, f"grid/{task_id}"),
        timeout=30,
        message=f"the worktree of {task_id} prepared ahead",
    )
    return path


# -- the decision ------------------------------------------------------------------------------


def test_the_next_ready_tasks_are_prepared_first_then_the_next_wave() -> None:
    tasks = [
        Task(id="run", title="r", status=TaskStatus.WORKING, branch="grid/run"),
        Task(id="r2", title="r", status=TaskStatus.READY, priority=3),
        Task(id="r1", title="r", status=TaskStatus.READY, priority=1),
        Task(id="retry", title="r", status=TaskStatus.READY, branch="grid/retry"),
        Task(id="next", title="n", status=TaskStatus.PENDING, depends_on=["run"]),
        Task(id="later", title="l", status=TaskStatus.PENDING, depends_on=["next"]),
        Task(id="going", title="g", status=TaskStatus.READY),
    ]
    assert worth_preparing(tasks, busy={"going"}, limit=8) == ["r1", "r2", "next"]
    assert worth_preparing(tasks, busy=set(), limit=2) == ["r1", "going"]
    assert worth_preparing(tasks, busy=set(), limit=0) == []


def test_a_prepared_worktree_is_dropped_once_its_task_will_not_start_from_it() -> None:
    def task(status: TaskStatus, branch: str | None = None) -> Task:
        return Task(id="t", title="t", status=status, branch=branch)

    running = {"wanted": {"t"}, "busy": set[str](), "session": True}
    assert keeps(task(TaskStatus.READY), **running)  # type: ignore[arg-type]
    assert keeps(task(TaskStatus.WORKING), wanted=set(), busy=set(), session=False)
    assert keeps(task(TaskStatus.READY), wanted=set(), busy={"t"}, session=False)
    assert not keeps(None, wanted={"t"}, busy=set(), session=True)  # deleted
    for gone in (TaskStatus.CANCELLED, TaskStatus.BLOCKED, TaskStatus.FAILED):
        assert not keeps(task(gone), wanted=set(), busy=set(), session=True)
    # re-planned behind a dependency not under way
    assert not keeps(task(TaskStatus.PENDING), wanted=set(), busy=set(), session=True)
    assert not keeps(task(TaskStatus.READY), wanted={"t"}, busy=set(), session=False)
    assert not keeps(task(TaskStatus.READY, "grid/t"), wanted={"t"}, busy=set(), session=True)


# -- on a real daemon ------------------------------------------------------------------------


def test_a_cancelled_tasks_prepared_worktree_is_removed_and_the_task_never_starts(
    repo: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    waiting_config(repo, go)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "first", "title": "runs first", "priority": 0})
        c.post("/tasks", {"id": "second", "title": "waits its turn", "priority": 1})
        c.post("/session/start", {"featureBranch": FEATURE, "maxAgents": 1})
        wait_for(lambda: c.get("/agents"), timeout=30)
        path = prepared(repo, "second")
        assert c.get("/tasks/second")["status"] == "ready"
        assert git(repo, "rev-parse", "grid/second") == git(repo, "rev-parse", FEATURE)
        assert c.request("DELETE", "/tasks/second")["status"] == "cancelled"
        wait_for(
            lambda: not path.exists() and not has_branch(repo, "grid/second"),
            timeout=15,
            message="the cancelled task's prepared worktree and branch removed",
        )
        go.write_text("")
        wait_task_status(c, "first", "review")
        assert c.get("/tasks/second")["status"] == "cancelled"
        spawned = event_log(c, types={"agent.spawned"})
        assert [e.data["taskId"] for e in spawned] == ["first"]
        assert not path.exists()


def test_a_task_whose_dependency_merged_after_preparation_starts_from_the_new_tip(
    repo: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    waiting_config(repo, go)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "dep", "title": "lands first"})
        c.post("/tasks", {"id": "after", "title": "builds on dep", "dependsOn": ["dep"]})
        c.post("/session/start", {"featureBranch": FEATURE, "maxAgents": 2})
        path = prepared(repo, "after")  # while dep works: the next wave
        old_tip = git(repo, "rev-parse", FEATURE)
        assert git(path, "rev-parse", "HEAD") == old_tip
        assert c.get("/tasks/after")["status"] == "pending"
        inode = path.stat().st_ino
        go.write_text("")
        wait_task_status(c, "dep", "review")
        c.post("/tasks/dep/approve")
        wait_task_status(c, "dep", "done")
        new_tip = git(repo, "rev-parse", FEATURE)
        assert new_tip != old_tip
        after = wait_task_status(c, "after", "review")
        assert after["baseCommit"] == new_tip  # never the stale base it was prepared from
        assert after["changedFiles"] == ["after.txt"]
        assert git(path, "show", "HEAD:dep.txt") == "work of dep"
        assert path.stat().st_ino == inode  # moved in place, not made again
        spawned = event_log(c, types={"agent.spawned"})
        assert sorted(e.data["taskId"] for e in spawned) == ["after", "dep"]


def test_a_daemon_killed_between_agent_exit_and_commit_with_a_worktree_prepared_loses_nothing(
    repo: Path, tmp_path: Path
) -> None:
    """As ``test_slots``' kill -9 between agent exit and commit, with the next task's
    worktree prepared: after the restart both tasks run once each, nothing is lost."""
    go = tmp_path / "go"
    waiting_config(repo, go)
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "kept", "title": "work to keep", "priority": 0})
        c.post("/tasks", {"id": "next", "title": "prepared meanwhile", "priority": 1})
        c.post("/session/start", {"featureBranch": FEATURE, "maxAgents": 1})
        agent = wait_for(lambda: c.get("/agents") and c.get("/agents")[0], timeout=30)
        assert agent["taskId"] == "kept"
        worktree = Path(str(agent["worktreePath"]))
        prepared(repo, "next")
        kill9_between_exit_and_commit(grid, c, worktree, go, "kept")
        kept = wait_task_status(c, "kept", "review", timeout=60)
        nxt = wait_task_status(c, "next", "review", timeout=60)
        assert kept["changedFiles"] == ["kept.txt"] and nxt["changedFiles"] == ["next.txt"]
        assert git(worktree, "show", "HEAD:kept.txt") == "work of kept"
        assert nxt["baseCommit"] == git(repo, "rev-parse", FEATURE)
        # One agent per task (a spawn cut short by the kill is adopted, not redone).
        completed = sorted(e.data["taskId"] for e in event_log(c, types={"agent.completed"}))
        assert completed == ["kept", "next"]
        spawned = [e.data["taskId"] for e in event_log(c, types={"agent.spawned"})]
        assert sorted(set(spawned)) == sorted(spawned)
        runs = [p for p in (repo / ".grid" / "runs").iterdir() if p.is_dir()]
        assert len(runs) == 2
        assert set(os.listdir(repo / ".grid" / "worktrees")) == {"kept", "next"}
