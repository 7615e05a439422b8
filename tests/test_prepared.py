"""Prepared worktrees (``gridd/git/prepared.py``): the next tasks' worktrees are made while
the slots are busy, and a prepared worktree never costs a stale base, a lost commit or a
second start. The decision is tested as a pure function; the rest on a real daemon, real git
and real agent processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gridd.git.prepared import keeps, owned, worth_preparing
from gridd.git.worktrees import WorktreeGone, Worktrees
from gridd.model import Task, TaskStatus
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon, kill9_between_exit_and_commit, restartable_daemon
from tests.support.git import git
from tests.support.processes import process_gone
from tests.support.repos import write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for

#: Writes ``<task>.txt``, then waits for a go file (outside the worktree) and exits 0.
WAITING_AGENT = (
    "import os, pathlib, sys, time\n"
    "task = os.environ['GRID_TASK_ID']\n"
    "pathlib.Path(task + '.txt').write_text('work of ' + task)\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
)
FEATURE = "feature/prep"


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
        lambda: (
            (path / ".git").exists()
            and has_branch(repo, f"grid/{task_id}")
            and not still_adding(repo, task_id)
        ),
        timeout=30,
        message=f"the worktree of {task_id} prepared ahead",
    )
    return path


def still_adding(repo: Path, task_id: str) -> bool:
    """Whether ``git worktree add`` is still making the worktree: it keeps its admin
    directory locked ("initializing") and its HEAD at the null id until it is done."""
    return (repo / ".git" / "worktrees" / task_id / "locked").exists()


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


def test_a_prepared_worktree_its_task_has_taken_over_is_forgotten_never_removed() -> None:
    def task(status: TaskStatus, branch: str | None = None) -> Task:
        return Task(id="t", title="t", status=status, branch=branch)

    assert owned(task(TaskStatus.BLOCKED, "grid/t"), busy=set())  # its record points there
    assert owned(task(TaskStatus.WORKING), busy=set())
    assert owned(task(TaskStatus.READY), busy={"t"})  # being started
    assert not owned(task(TaskStatus.READY), busy=set())
    assert not owned(task(TaskStatus.CANCELLED), busy=set())
    assert not owned(None, busy=set())


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
        assert (
            git(repo, "rev-parse", "grid/second").strip() == git(repo, "rev-parse", FEATURE).strip()
        )
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
        old_tip = git(repo, "rev-parse", FEATURE).strip()
        assert git(path, "rev-parse", "HEAD").strip() == old_tip
        assert c.get("/tasks/after")["status"] == "pending"
        inode = path.stat().st_ino
        go.write_text("")
        wait_task_status(c, "dep", "review")
        c.post("/tasks/dep/approve")
        wait_task_status(c, "dep", "done")
        new_tip = git(repo, "rev-parse", FEATURE).strip()
        assert new_tip != old_tip
        after = wait_task_status(c, "after", "review")
        assert after["baseCommit"] == new_tip  # never the stale base it was prepared from
        assert after["changedFiles"] == ["after.txt"]
        assert git(path, "show", "HEAD:dep.txt").strip() == "work of dep"
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
        assert git(worktree, "show", "HEAD:kept.txt").strip() == "work of kept"
        assert nxt["baseCommit"] == git(repo, "rev-parse", FEATURE).strip()
        # One agent per task (a spawn cut short by the kill is adopted, not redone).
        completed = sorted(e.data["taskId"] for e in event_log(c, types={"agent.completed"}))
        assert completed == ["kept", "next"]
        spawned = [e.data["taskId"] for e in event_log(c, types={"agent.spawned"})]
        assert sorted(set(spawned)) == sorted(spawned)
        runs = [p for p in (repo / ".grid" / "runs").iterdir() if p.is_dir()]
        assert len(runs) == 2
        assert set(os.listdir(repo / ".grid" / "worktrees")) == {"kept", "next"}


def test_a_task_prepared_before_a_restart_starts_in_its_worktree_after_it(
    repo: Path, tmp_path: Path
) -> None:
    """The daemon is killed while three tasks run and the fourth's worktree is prepared;
    the three agents end while no daemon is up. After the restart the freed slot starts the
    fourth at once, while the preparer adopts the worktrees left behind: the adoption must
    not hand the started task's worktree to the preparer to remove as not needed (its agent
    then ran in a deleted directory, its finish failed, and its branch was gone)."""
    go = tmp_path / "go"
    waiting_config(repo, go)
    with restartable_daemon(repo) as grid:
        c = grid.client()
        for n in range(1, 7):
            c.post("/tasks", {"id": f"t{n}", "title": f"task {n}", "priority": min(n, 4)})
        c.post("/session/start", {"featureBranch": FEATURE, "maxAgents": 3})
        running = wait_for(
            lambda: (
                len(agents := c.get("/agents")) == 3 and all(a["pid"] for a in agents) and agents
            ),
            timeout=30,
            message="three agents running",
        )
        for n in (4, 5, 6):
            prepared(repo, f"t{n}")
        pids = [int(a["pid"]) for a in running]
        grid.kill9()
        go.write_text("")
        wait_for(lambda: all(process_gone(pid) for pid in pids), timeout=30)
        grid.start()
        settled = wait_for(
            lambda: (
                (ts := c.get("/tasks"))
                and all(t["status"] not in ("ready", "working") for t in ts)
                and ts
            ),
            timeout=60,
            message="every task run once after the restart",
        )
        assert {t["id"]: t["status"] for t in settled} == {f"t{n}": "review" for n in range(1, 7)}
        for task in settled:
            n = task["id"][1:]
            assert task["changedFiles"] == [f"t{n}.txt"]
            assert git(repo, "show", f"grid/t{n}:t{n}.txt").strip() == f"work of t{n}"
        assert not event_log(c, types={"agent.finish_failed", "task.start_failed"})
        spawned = [e.data["taskId"] for e in event_log(c, types={"agent.spawned"})]
        assert sorted(spawned) == [f"t{n}" for n in range(1, 7)]
        log = (repo / ".grid" / "gridd.log").read_text()
        assert "removed the prepared worktree" not in log


def test_a_task_whose_worktree_and_branch_are_gone_starts_afresh(repo: Path) -> None:
    """A task's record names a branch, but the branch and its worktree are gone: its next
    start makes a fresh worktree and branch instead of failing on an invalid reference; and
    recording work in a worktree that is gone says so instead of raising FileNotFoundError."""

    async def main() -> None:
        worktrees = Worktrees(repo, repo / ".grid" / "worktrees")
        await worktrees.setup()
        first = await worktrees.create("t", None)
        git(repo, "worktree", "remove", "--force", "--", str(first.path))
        git(repo, "branch", "-D", "--", first.branch)
        with pytest.raises(WorktreeGone):
            await worktrees.record(first.path, "never")
        again = await worktrees.create("t", None, known_base=first.base)
        assert (again.path / ".git").exists() and again.branch == first.branch
        assert again.base == git(repo, "rev-parse", "HEAD").strip()
        assert git(again.path, "rev-parse", "HEAD").strip() == again.base

    asyncio.run(main())
