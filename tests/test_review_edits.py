"""Review edits are kept or refused, never dropped (#22), on real repositories and daemons.

A reviewer who fixes a line in a task's worktree (the right side of its diff in the editor)
and approves gets the fix merged: it is committed on the task's branch as a review commit
by the git identity of the user running the daemon. With ``[merge] review_edits =
"refuse"`` the approve answers 409 ``worktree_dirty`` listing the files instead, and the
edit stays where it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gridd.errors import Conflict
from tests.support.api import wait_task_status
from tests.support.cli import gridctl
from tests.support.daemons import core_daemon
from tests.support.git import git
from tests.support.sse import event_log
from tests.test_merge_queue import configure, files_on, task


def test_an_edit_left_in_the_worktree_at_approve_is_merged_as_a_review_commit(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", task("t", {"a.txt": "the agent's line\n"}))
        c.post("/session/start", {"featureBranch": "feature/review"})
        reviewed = wait_task_status(c, "t", "review")
        worktree = Path(str(reviewed["worktree"]))
        (worktree / "a.txt").write_text("the reviewer's fix\n")  # saved in the editor
        (worktree / "notes.txt").write_text("a file the reviewer added\n")
        c.post("/tasks/t/approve")
        wait_task_status(c, "t", "done")
        assert git(repo, "show", "feature/review:a.txt") == "the reviewer's fix\n"
        assert "notes.txt" in files_on(repo, "feature/review")
        review = git(repo, "log", "-1", "--format=%an <%ae>%n%B", "grid/t")
        assert review.startswith("gridd tests <test@example.com>\nreview edits\n")
        assert "Grid-Review: t" in review
        kept = [e.data for e in event_log(c, types={"task.review_edits"})]
        assert kept == [
            {
                "taskId": "t",
                "commit": git(repo, "rev-parse", "grid/t").strip(),
                "files": ["a.txt", "notes.txt"],
            }
        ]
        assert set(c.get("/tasks/t")["changedFiles"]) == {"a.txt", "notes.txt"}


def test_refuse_answers_409_worktree_dirty_and_keeps_the_edit(repo: Path, logdir: Path) -> None:
    configure(repo, logdir, merge={"review_edits": "refuse"})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", task("t", {"a.txt": "the agent's line\n"}))
        c.post("/session/start", {"featureBranch": "feature/strict"})
        reviewed = wait_task_status(c, "t", "review")
        worktree = Path(str(reviewed["worktree"]))
        (worktree / "a.txt").write_text("the reviewer's fix\n")
        branch_before = git(repo, "rev-parse", "grid/t").strip()
        with pytest.raises(Conflict) as refused:
            c.post("/tasks/t/approve")
        assert refused.value.code == "worktree_dirty"
        assert refused.value.details["files"] == ["a.txt"]
        assert c.get("/tasks/t")["status"] == "review"
        assert (worktree / "a.txt").read_text() == "the reviewer's fix\n"  # nothing lost
        assert git(repo, "rev-parse", "grid/t").strip() == branch_before
        said = gridctl(repo, "task", "approve", "t")
        assert said.returncode != 0 and "a.txt" in said.stderr and "Traceback" not in said.stderr
        # committed by hand, the approve goes through with the fix
        git(worktree, "commit", "-qam", "the reviewer's fix")
        c.post("/tasks/t/approve")
        wait_task_status(c, "t", "done")
        assert git(repo, "show", "feature/strict:a.txt") == "the reviewer's fix\n"


@pytest.mark.parametrize("mode", ["commit", "refuse"])
def test_the_daemon_reports_its_review_edits_policy_in_state_and_snapshot(
    repo: Path, logdir: Path, mode: str
) -> None:
    # An editor says what an approve will do with the reviewer's edits before it happens;
    # it asks the daemon (the policy it runs with), not the config file it may not share.
    configure(repo, logdir, merge={"review_edits": mode} if mode == "refuse" else None)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        assert c.get("/state")["daemon"]["reviewEdits"] == mode
        stream = c.events(read_timeout=10)
        try:
            snapshot = next(stream)
        finally:
            stream.close()  # type: ignore[attr-defined]
        assert snapshot.type == "state.snapshot"
        assert snapshot.data["daemon"]["reviewEdits"] == mode
