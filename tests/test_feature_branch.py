"""The session's feature branch on real repositories: created once (even when starts and
spawns race), refused while checked out anywhere or when not a branch name, continued from
its tip when it exists; and a daemon killed between a merge and the ref update leaves the
branch as it was, the queue finishing the merge on restart. One session, one feature branch:
another branch is refused while a session runs or its work waits in review, each task
records the branch it was merged into, and finish, /state and status report per branch."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path

import pytest

from gridd.client import GridClient
from gridd.errors import Conflict, ValidationFailed
from gridd.git.worktrees import Worktrees
from tests.support.api import wait_task_status
from tests.support.cli import gridctl
from tests.support.daemons import core_daemon
from tests.support.git import git
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for


def configure(root: Path) -> None:
    write_core_config(
        root,
        agents={"work": {"command": agent_command("trivial.py")}},
        scheduler={"default_agent": "work", "max_attempts": 1},
    )


@pytest.mark.parametrize("name", ["HEAD", "-x", "a..b", "a\x01b", "bad~name", "x.lock", "a b"])
def test_an_invalid_feature_branch_is_refused_with_422(repo: Path, name: str) -> None:
    configure(repo)
    with core_daemon(repo) as daemon, pytest.raises(ValidationFailed):
        daemon.client().post("/session/start", {"featureBranch": name})


def test_a_checked_out_feature_branch_is_refused_with_409(repo: Path) -> None:
    configure(repo)
    other = repo.parent / (repo.name + "-other")
    git(repo, "worktree", "add", "-q", "-b", "elsewhere", str(other))
    try:
        with core_daemon(repo) as daemon:
            c = daemon.client()
            for branch in ("main", "elsewhere"):  # the user's own checkout, and another
                with pytest.raises(Conflict) as info:
                    c.post("/session/start", {"featureBranch": branch})
                assert info.value.code == "branch_checked_out"
            with pytest.raises(ValidationFailed) as bad_base:
                c.post("/session/start", {"featureBranch": "f", "baseBranch": "nope"})
            assert bad_base.value.code == "unknown_base_branch"
            assert not c.get("/state")["session"]["started"]
            assert (
                subprocess.run(
                    ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", "refs/heads/f"],
                    capture_output=True,
                ).returncode
                != 0
            )
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(other)])


def test_an_existing_feature_branch_is_continued_from_its_tip(repo: Path) -> None:
    configure(repo)
    git(repo, "checkout", "-q", "-b", "feature/old")
    (repo / "earlier.txt").write_text("earlier work\n")
    git(repo, "add", "earlier.txt")
    git(repo, "commit", "-q", "-m", "earlier work")
    tip = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "t1", "title": "more"})
        session = c.post("/session/start", {"featureBranch": "feature/old"})
        assert session["featureBranch"] == "feature/old"
        done = wait_task_status(c, "t1", "review")
        assert done["baseCommit"] == tip
        assert (Path(str(done["worktree"])) / "earlier.txt").exists()
        assert not event_log(c, types={"session.branch_created"})


def test_concurrent_session_starts_create_the_branch_once_and_every_task_spawns(
    repo: Path,
) -> None:
    configure(repo)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/plans", {"tasks": [{"id": f"t{i}", "title": f"task {i}"} for i in range(4)]})
        results: list[object] = []

        def start() -> None:
            with daemon.client() as own:
                try:
                    results.append(
                        own.post(
                            "/session/start", {"featureBranch": "feature/race", "maxAgents": 4}
                        )
                    )
                except Exception as exc:  # recorded, asserted below
                    results.append(exc)

        threads = [threading.Thread(target=start) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(isinstance(r, dict) for r in results), results
        for i in range(4):
            wait_task_status(c, f"t{i}", "review")
        assert len(event_log(c, types={"session.branch_created"})) == 1
        assert not event_log(c, types={"task.start_failed"})


def test_racing_spawns_creating_one_branch_all_get_it(repo: Path) -> None:
    worktrees = Worktrees(repo, repo / ".grid" / "worktrees")

    async def race() -> list[str]:
        return list(await asyncio.gather(*(worktrees.ensure_branch("feature/x") for _ in range(8))))

    commits = asyncio.run(race())
    assert len(set(commits)) == 1
    assert commits[0] == git(repo, "rev-parse", "refs/heads/feature/x").strip()


def test_daemon_killed_between_merge_and_ref_update_leaves_no_half_state(repo: Path) -> None:
    configure(repo)
    pause = repo.parent / (repo.name + ".pause")
    reached = pause.with_name(pause.name + ".reached")
    try:
        with core_daemon(repo, env={"GRIDD_TEST_MERGE_PAUSE": str(pause)}) as daemon:
            c = daemon.client()
            c.post("/tasks", {"id": "k", "title": "killed mid-merge"})
            c.post("/session/start", {"featureBranch": "feature/k9"})
            wait_task_status(c, "k", "review")
            before = git(repo, "rev-parse", "feature/k9").strip()
            pause.touch()
            c.post("/tasks/k/approve")
            wait_for(reached.exists, timeout=20, message="the merge to reach the ref update")
            task = c.get("/tasks/k")
            assert task["status"] == "merging" and task["mergeCommit"]
            daemon.kill9()
        assert git(repo, "rev-parse", "feature/k9").strip() == before  # nothing half-applied
        with core_daemon(repo) as daemon:
            c = daemon.client()
            done = wait_task_status(c, "k", "done", timeout=20)
            head = git(repo, "rev-parse", "feature/k9").strip()
            assert done["mergeCommit"] == head
            assert git(repo, "rev-parse", f"{head}^1").strip() == before  # merged exactly once
            assert "k.txt" in git(repo, "ls-tree", "--name-only", head)
            integration = repo / ".grid" / "integration"
            assert git(integration, "status", "--porcelain").strip() == ""
    finally:
        pause.unlink(missing_ok=True)
        reached.unlink(missing_ok=True)


# -- one session, one feature branch (#22) ------------------------------------------------------


def branch_exists(root: Path, name: str) -> bool:
    found = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"refs/heads/{name}"],
        capture_output=True,
    )
    return found.returncode == 0


def refused_retarget(c: GridClient, branch: str) -> Conflict:
    with pytest.raises(Conflict) as info:
        c.post("/session/start", {"featureBranch": branch})
    assert info.value.code == "session_running"
    return info.value


def test_a_running_session_is_not_retargeted_until_stopped_and_its_review_settled(
    repo: Path,
) -> None:
    configure(repo)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "a", "title": "first branch's work"})
        # b waits for a: the session keeps running with no agent while a is in review.
        c.post("/tasks", {"id": "b", "title": "second branch's work", "dependsOn": ["a"]})
        c.post("/session/start", {"featureBranch": "feature/one", "maxAgents": 2})
        wait_task_status(c, "a", "review")
        one_tip = git(repo, "rev-parse", "feature/one").strip()
        assert not c.get("/agents")

        # The session runs: another branch is refused, and nothing moves.
        running = refused_retarget(c, "feature/two")
        assert "feature/one" in running.message and "gridctl session stop" in running.message
        assert running.details["featureBranch"] == "feature/one"
        assert not branch_exists(repo, "feature/two")
        assert git(repo, "rev-parse", "feature/one").strip() == one_tip
        state = c.get("/state")
        assert state["session"]["started"] and state["session"]["featureBranch"] == "feature/one"
        assert c.get("/tasks/a")["status"] == "review"
        # The same branch again is not a retarget: it changes the session in place.
        again = c.post("/session/start", {"featureBranch": "feature/one", "maxAgents": 2})
        assert again["featureBranch"] == "feature/one" and again["maxAgents"] == 2

        # Stopped, with its task still in review: still refused, naming that task.
        c.post("/session/stop")
        waiting = refused_retarget(c, "feature/two")
        assert waiting.details["tasks"] == ["a"] and "approve" in waiting.message
        assert not branch_exists(repo, "feature/two")

        c.post("/tasks/a/approve")
        assert wait_task_status(c, "a", "done")["mergedInto"] == "feature/one"

        # Now a new branch works, and its task records it.
        session = c.post("/session/start", {"featureBranch": "feature/two", "maxAgents": 1})
        assert session["featureBranch"] == "feature/two" and branch_exists(repo, "feature/two")
        wait_task_status(c, "b", "review")
        c.post("/tasks/b/approve")
        assert wait_task_status(c, "b", "done")["mergedInto"] == "feature/two"


def test_finish_state_and_status_report_per_feature_branch(repo: Path) -> None:
    configure(repo)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "a", "title": "first branch's work"})
        c.post("/session/start", {"featureBranch": "feature/one"})
        wait_task_status(c, "a", "review")
        c.post("/tasks/a/approve")
        merged_a = wait_task_status(c, "a", "done")
        c.post("/session/stop")

        c.post("/tasks", {"id": "b", "title": "second branch's work"})
        c.post("/session/start", {"featureBranch": "feature/two"})
        wait_task_status(c, "b", "review")
        c.post("/tasks/b/approve")
        wait_task_status(c, "b", "done")

        report = c.post("/session/finish")
        assert report["featureBranch"] == "feature/two"
        assert report["mergedTasks"] == ["b"]
        finished = gridctl(repo, "session", "finish")  # the command line says the same
        assert finished.returncode == 0, finished.stderr
        assert "merged tasks: b\n" in finished.stdout

        stats = c.get("/state")["stats"]
        assert stats["mergedByBranch"] == {"feature/one": 1, "feature/two": 1}
        status = gridctl(repo, "status")
        assert status.returncode == 0, status.stderr
        assert "merged: 1 into feature/two (this session), 1 into feature/one" in status.stdout
        # The first session's branch is as its own merge left it.
        assert git(repo, "rev-parse", "feature/one").strip() == merged_a["mergeCommit"]
