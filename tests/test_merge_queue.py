"""The merge queue on real repositories and real daemons: approved work lands on the
feature branch one task at a time, dependants start from it, conflicts and failed checks
leave the branch untouched and go to the session's policy, a user's own commits on the
branch are kept, and a daemon killed between merge and ref update leaves no half state."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.client import GridClient
from gridd.errors import Conflict, ValidationFailed
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for


def files_on(root: Path, ref: str) -> set[str]:
    return set(git(root, "ls-tree", "-r", "--name-only", ref).split())


@pytest.fixture
def logdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="glog") as d:
        yield Path(d)


def configure(root: Path, logdir: Path, merge: dict[str, object] | None = None) -> None:
    write_core_config(
        root,
        agents={"edit": {"command": agent_command("editor.py", str(logdir), "{prompt}")}},
        scheduler={"default_agent": "edit"},
    )
    if merge:
        lines = ["", "[merge]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in merge.items()]
        with (root / ".grid" / "config.toml").open("a") as fh:
            fh.write("\n".join(lines) + "\n")


def task(task_id: str, write: dict[str, str], **extra: object) -> dict[str, object]:
    return {
        "id": task_id,
        "title": f"task {task_id}",
        "prompt": json.dumps({"write": write}),
        **extra,
    }


def runs(logdir: Path, task_id: str) -> list[dict[str, object]]:
    found = []
    n = 1
    while (logdir / f"{task_id}-{n}.json").exists():
        found.append(json.loads((logdir / f"{task_id}-{n}.json").read_text()))
        n += 1
    return found


def approve_when_in_review(c: GridClient, *ids: str) -> None:
    for task_id in ids:
        wait_task_status(c, task_id, "review")
        c.post(f"/tasks/{task_id}/approve")


# -- the happy path ------------------------------------------------------------------------------


def test_dependant_starts_from_merged_work_and_the_feature_branch_ends_with_all(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post(
            "/plans",
            {
                "tasks": [
                    task("a", {"a.txt": "from a\n"}),
                    task("b", {"b.txt": "from b\n"}),
                    task("c", {"c.txt": "from c\n"}, dependsOn=["a", "b"]),
                ]
            },
        )
        session = c.post("/session/start", {"featureBranch": "feature/abc", "maxAgents": 2})
        assert session["baseBranch"] == "main"
        wait_task_status(c, "a", "review")
        queued = c.post("/tasks/a/approve")
        assert queued["status"] in ("merging", "done")
        # The user commits to the feature branch while the session runs (not checked out:
        # a commit made with plumbing, as a script or another clone's push would).
        tip = git(repo, "rev-parse", "feature/abc").strip()
        blob = subprocess.run(
            ["git", "-C", str(repo), "hash-object", "-w", "--stdin"],
            input="mine\n",
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        tree_in = git(repo, "ls-tree", tip) + f"100644 blob {blob}\tuser.txt\n"
        tree = subprocess.run(
            ["git", "-C", str(repo), "mktree"],
            input=tree_in,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        user = git(repo, "commit-tree", tree, "-p", tip, "-m", "the user's own commit").strip()
        git(repo, "update-ref", "refs/heads/feature/abc", user, tip)
        approve_when_in_review(c, "b")
        done_c = wait_task_status(c, "c", "review", timeout=40)
        assert done_c["status"] == "review"
        start = runs(logdir, "c")[0]["files"]
        assert {"a.txt", "b.txt"} <= set(start)  # integrated work at spawn
        approve_when_in_review(c, "c")
        merged = wait_task_status(c, "c", "done")
        head = git(repo, "rev-parse", "feature/abc").strip()
        assert merged["mergeCommit"] == head
        assert {"a.txt", "b.txt", "c.txt", "user.txt", "README.md"} <= files_on(repo, head)
        # the user's commit is kept: it is an ancestor of the branch
        git(repo, "merge-base", "--is-ancestor", user, head)
        events = event_log(c, types={"task.merged", "task.merge_queued"})
        merged_events = [e.data for e in events if e.type == "task.merged"]
        assert [e["taskId"] for e in merged_events] == ["a", "b", "c"]
        assert all(e["featureBranch"] == "feature/abc" for e in merged_events)
        # the merge commits name their task; the user's checkout was never touched
        log = git(repo, "log", "--format=%s", "feature/abc")
        assert "gridd: merge task c: task c" in log
        assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
        assert git(repo, "status", "--porcelain", "--", ":!.gridd-test-stderr").strip() == ""
        # clean, merged worktrees are removed; branches kept by default
        wait_for(lambda: c.get("/tasks/c")["worktree"] is None, timeout=10)
        assert git(repo, "rev-parse", "--verify", "grid/c")


def test_diff_shows_the_task_change_against_its_base(repo: Path, logdir: Path) -> None:
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", task("d", {"d.txt": "one\ntwo\n", "README.md": "changed\n"}))
        c.post("/session/start", {"featureBranch": "feature/diff"})
        wait_task_status(c, "d", "review")
        diff = c.get("/tasks/d/diff")
        assert diff["taskId"] == "d"
        assert diff["base"] == git(repo, "rev-parse", "feature/diff").strip()
        assert diff["head"] == git(repo, "rev-parse", "grid/d").strip()
        by_path = {f["path"]: f for f in diff["files"]}
        assert by_path["d.txt"] == {
            "path": "d.txt",
            "status": "added",
            "additions": 2,
            "deletions": 0,
        }
        assert by_path["README.md"]["status"] == "modified"
        assert "+two" in diff["patch"]
        c.post("/tasks", {"id": "e", "title": "not run"})
        with pytest.raises(Conflict) as info:
            c.get("/tasks/e/diff")
        assert info.value.code == "task_has_no_branch"


# -- conflicts ------------------------------------------------------------------------------------


def conflict_plan() -> list[dict[str, object]]:
    return [
        task("x", {"shared.txt": "line from x\n"}),
        task("y", {"shared.txt": "line from y\n"}),
    ]


def start_conflict(c: GridClient, policy: str) -> str:
    c.post("/plans", {"tasks": conflict_plan()})
    c.post("/session/start", {"featureBranch": "feature/clash", "onConflict": policy})
    wait_task_status(c, "x", "review")
    wait_task_status(c, "y", "review")
    c.post("/tasks/x/approve")
    wait_task_status(c, "x", "done")
    return str(c.get("/tasks/x")["mergeCommit"])


def test_conflict_leaves_the_branch_untouched_and_the_agent_resolves_it(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        after_x = start_conflict(c, "agent")
        y_head = git(repo, "rev-parse", "grid/y").strip()
        c.post("/tasks/y/approve")
        wait_for(lambda: runs(logdir, "y")[1:], timeout=30, message="y's second run")
        conflicts = [e.data for e in event_log(c, types={"task.merge_conflict"})]
        assert conflicts == [{"taskId": "y", "files": ["shared.txt"], "featureCommit": after_x}]
        assert git(repo, "rev-parse", "feature/clash").strip() == after_x  # untouched
        second = runs(logdir, "y")[1]
        assert second["resolved"] == ["shared.txt"]
        assert "shared.txt" in str(second["prompt"])
        wait_task_status(c, "y", "review")
        c.post("/tasks/y/approve")
        wait_task_status(c, "y", "done")
        head = git(repo, "rev-parse", "feature/clash").strip()
        text = git(repo, "show", f"{head}:shared.txt")
        assert "line from x" in text and "line from y" in text and "<<<<<<<" not in text
        git(repo, "merge-base", "--is-ancestor", y_head, "grid/y")  # its commits kept


def test_human_policy_keeps_the_task_in_review_and_asks(repo: Path, logdir: Path) -> None:
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        after_x = start_conflict(c, "human")
        c.post("/tasks/y/approve")
        y = wait_for(
            lambda: (t := c.get("/tasks/y"))["status"] == "review" and t["mergeConflict"] and t,
            timeout=20,
        )
        assert y["mergeConflict"] == ["shared.txt"]
        assert git(repo, "rev-parse", "feature/clash").strip() == after_x
        question = wait_for(lambda: c.get("/questions"), timeout=10)[0]
        assert question["taskId"] == "y" and "merge again" in question["options"]
        c.post(f"/questions/{question['id']}/answer", {"response": "fail"})
        wait_task_status(c, "y", "failed")
        assert git(repo, "rev-parse", "--verify", "grid/y")  # its branch is kept


def test_fail_policy_fails_the_task_and_keeps_its_branch(repo: Path, logdir: Path) -> None:
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        after_x = start_conflict(c, "fail")
        y_head = git(repo, "rev-parse", "grid/y").strip()
        c.post("/tasks/y/approve")
        failed = wait_task_status(c, "y", "failed")
        assert "conflict" in str(failed["error"])
        assert git(repo, "rev-parse", "feature/clash").strip() == after_x
        assert git(repo, "rev-parse", "grid/y").strip() == y_head


def test_a_failing_check_refuses_the_merge(repo: Path, logdir: Path) -> None:
    check = ["sh", "-c", "echo checking; test ! -e bad.txt || { echo bad file found; exit 3; }"]
    configure(repo, logdir, merge={"check": check, "check_timeout_seconds": 20})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post(
            "/plans", {"tasks": [task("ok", {"ok.txt": "fine\n"}), task("bad", {"bad.txt": "x\n"})]}
        )
        c.post("/session/start", {"featureBranch": "feature/gate", "onConflict": "fail"})
        approve_when_in_review(c, "ok")
        wait_task_status(c, "ok", "done")
        before = git(repo, "rev-parse", "feature/gate").strip()
        approve_when_in_review(c, "bad")
        wait_task_status(c, "bad", "failed")
        assert git(repo, "rev-parse", "feature/gate").strip() == before
        failed = [e.data for e in event_log(c, types={"task.merge_check_failed"})]
        assert failed and failed[0]["taskId"] == "bad"
        assert "bad file found" in failed[0]["output"]


# -- the review loop -------------------------------------------------------------------------------


def test_a_rejected_task_starts_a_new_round_of_attempts_not_a_failed_one(
    repo: Path, logdir: Path
) -> None:
    # maxAttempts counts failed runs: three rounds of review must not use up a budget of 1.
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", task("r", {"r.txt": "first\n"}, maxAttempts=1))
        c.post("/session/start", {"featureBranch": "feature/rounds"})
        assert wait_task_status(c, "r", "review")["attempts"] == 1
        for n in range(2, 5):
            rejected = c.post("/tasks/r/reject", {"feedback": f"round {n}"})
            assert rejected["status"] == "working"
            wait_for(lambda n=n: len(runs(logdir, "r")) == n, timeout=20)
            again = wait_task_status(c, "r", "review")
            assert again["attempts"] == 1
            assert again["maxAttempts"] == 1


def test_reject_reruns_the_agent_in_its_worktree_with_the_feedback(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", task("r", {"r.txt": "first\n"}))
        c.post("/session/start", {"featureBranch": "feature/review"})
        first = wait_task_status(c, "r", "review")
        rejected = c.post("/tasks/r/reject", {"feedback": "please also add a changelog"})
        assert rejected["status"] == "working"
        wait_for(lambda: len(runs(logdir, "r")) == 2, timeout=20)
        again = wait_task_status(c, "r", "review")
        assert again["worktree"] == first["worktree"]
        second = runs(logdir, "r")[1]
        assert "r.txt" in second["files"]  # the same worktree and branch: its work is there
        assert "please also add a changelog" in str(second["prompt"])
        assert "r.feedback.txt" in files_on(repo, "grid/r")
        events = [e.data for e in event_log(c, types={"task.rejected"})]
        assert events == [{"taskId": "r", "feedback": "please also add a changelog"}]
        with pytest.raises(ValidationFailed):
            c.post("/tasks/r/reject", {"feedback": ""})
        c.post("/tasks/r/approve")
        with pytest.raises(Conflict) as info:
            c.post("/tasks/r/reject", {"feedback": "too late"})
        assert info.value.code in ("task_not_in_review",)
