"""Nothing unresolved reaches the feature branch (#22), on real repositories and daemons.

An agent sent back to resolve a merge conflict that exits 0 with the conflict still there
(markers left, or even staged with ``git add``) never has its run committed nor reviewed:
it goes back to its agent while attempts remain, then waits for a human with the conflict
named. The merge queue refuses any result that adds conflict markers, whatever the policy,
unless the config allows the path or the approve accepts it. And the finisher commits only
in the worktree gridd made, never in a checkout an agent pointed its ``.git`` at.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gridd.client import GridClient
from tests.support.api import wait_pending_question, wait_task_status
from tests.support.cli import gridctl
from tests.support.daemons import core_daemon
from tests.support.git import git
from tests.support.repos import write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for
from tests.test_merge_queue import configure, runs, task

#: Marker-like lines, as a test fixture about git would hold them.
MARKED = "<<<<<<< ours\nmine\n=======\ntheirs\n>>>>>>> theirs\n"


def marker_commits(root: Path, ref: str) -> list[str]:
    """Every commit reachable from ``ref`` whose tree holds a conflict-marker line."""
    held = []
    for commit in git(root, "rev-list", ref).split():
        found = subprocess.run(
            ["git", "-C", str(root), "grep", "-l", "-E", "^(<<<<<<<|>>>>>>>)", commit],
            capture_output=True,
            text=True,
            check=False,
        )
        if found.stdout.strip():
            held.append(commit)
    return held


def statuses_of(c: GridClient, task_id: str) -> list[str]:
    """The statuses ``task_id`` went through, as the event log tells them."""
    seen: list[str] = []
    for event in event_log(c, types={"tasks.changed"}):
        for t in event.data["tasks"]:
            if t["id"] == task_id and (not seen or seen[-1] != t["status"]):
                seen.append(t["status"])
    return seen


def approve_into_conflict(
    c: GridClient, root: Path, *, mode: str, policy: str, attempts: int = 2, **behaviour: object
) -> str:
    """x and y both write shared.txt; x is merged, then y approved into the conflict. y's
    agent fails at resolving it as ``mode`` (and ``behaviour``) say (editor.py). Returns
    F's tip after x."""
    y = task("y", {"shared.txt": "line from y\n"}, maxAttempts=attempts)
    write = {"shared.txt": "line from y\n"}
    y["prompt"] = json.dumps({"write": write, "conflicts": mode, **behaviour})
    c.post("/plans", {"tasks": [task("x", {"shared.txt": "line from x\n"}), y]})
    c.post("/session/start", {"featureBranch": "feature/clash", "onConflict": policy})
    wait_task_status(c, "x", "review")
    wait_task_status(c, "y", "review")
    c.post("/tasks/x/approve")
    wait_task_status(c, "x", "done")
    after_x = git(root, "rev-parse", "feature/clash").strip()
    c.post("/tasks/y/approve")
    return after_x


def resolve_by_hand(worktree: Path) -> None:
    (worktree / "shared.txt").write_text("line from x\nline from y\n")
    git(worktree, "add", "shared.txt")


# -- an agent that does not resolve the conflict -----------------------------------------------


@pytest.mark.parametrize("mode", ["leave", "add"])
def test_an_unresolved_conflict_goes_back_to_the_agent_then_waits_for_a_human(
    repo: Path, logdir: Path, mode: str
) -> None:
    # leave: markers in place, the index unmerged; add: the agent staged the markers itself
    # (no unmerged entry left, the merge still in progress, the markers in the file).
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        after_x = approve_into_conflict(c, repo, mode=mode, policy="agent")
        y_branch_before = git(repo, "rev-parse", "grid/y").strip()
        # the conflict round's two attempts (maxAttempts 2), then a human
        blocked = wait_task_status(c, "y", "blocked", timeout=60)
        assert len(runs(logdir, "y")) == 3  # the first run, then the two of the round
        assert blocked["conflictUnresolved"] == ["shared.txt"]
        assert "shared.txt" in str(blocked["error"])
        unresolved = [e.data for e in event_log(c, types={"task.conflict_unresolved"})]
        assert [u["willRetry"] for u in unresolved] == [True, False]
        assert all(u["files"] == ["shared.txt"] for u in unresolved)
        assert any("<<<<<<<" in line for line in unresolved[0]["lines"])
        assert unresolved[0]["unmerged"] == (["shared.txt"] if mode == "leave" else [])
        # the second run of the round was told which file and which lines
        retry_prompt = str(runs(logdir, "y")[2]["prompt"])
        assert "shared.txt:" in retry_prompt and "<<<<<<<" in retry_prompt
        question = wait_pending_question(c, "y")
        assert question["options"] == ["check again", "review anyway", "agent"]
        assert "shared.txt" in str(question["question"])
        # never in review with the markers, never committed, never on the feature branch
        after_approve = statuses_of(c, "y")[statuses_of(c, "y").index("merging") :]
        assert "review" not in after_approve
        assert git(repo, "rev-parse", "grid/y").strip() == y_branch_before
        assert git(repo, "rev-parse", "feature/clash").strip() == after_x
        assert marker_commits(repo, "grid/y") == []
        # the human path: resolved in the worktree, checked again, reviewed, merged
        resolve_by_hand(Path(str(blocked["worktree"])))
        c.post(f"/questions/{question['id']}/answer", {"response": "check again"})
        reviewed = wait_task_status(c, "y", "review")
        assert reviewed["conflictUnresolved"] == []
        c.post("/tasks/y/approve")
        wait_task_status(c, "y", "done")
        text = git(repo, "show", "feature/clash:shared.txt")
        assert text == "line from x\nline from y\n"
        assert marker_commits(repo, "feature/clash") == []


def test_check_again_with_the_conflict_still_there_asks_again(repo: Path, logdir: Path) -> None:
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        approve_into_conflict(c, repo, mode="leave", policy="human")
        # under human: the merge conflict is asked about; sent to the agent, which fails
        first = wait_pending_question(c, "y")
        c.post(f"/questions/{first['id']}/answer", {"response": "agent"})
        blocked = wait_task_status(c, "y", "blocked", timeout=30)
        assert len(runs(logdir, "y")) == 2  # human: no second try by the agent
        question = wait_pending_question(c, "y")
        c.post(f"/questions/{question['id']}/answer", {"response": "check again"})
        again = wait_for(
            lambda: [q for q in c.get("/questions") if q["id"] != question["id"]], timeout=15
        )[0]
        assert again["taskId"] == "y" and "shared.txt" in str(again["question"])
        assert c.get("/tasks/y")["status"] == "blocked"
        assert marker_commits(repo, "grid/y") == []
        assert blocked["conflictUnresolved"] == ["shared.txt"]
        # started again by hand instead: the question is moot, and closed
        c.post("/tasks/y/start")
        assert c.get(f"/questions/{again['id']}")["status"] == "closed"


def test_a_run_that_fails_in_the_middle_of_a_conflict_commits_nothing(
    repo: Path, logdir: Path
) -> None:
    # A failed (or stopped) run's work in progress is normally committed; not a merge left
    # half done: that commit would conclude it, markers and all.
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        approve_into_conflict(
            c, repo, mode="leave", policy="agent", attempts=1, fail_in_conflict=True
        )
        y_branch_before = git(repo, "rev-parse", "grid/y").strip()
        failed = wait_task_status(c, "y", "failed", timeout=30)
        assert len(runs(logdir, "y")) == 2
        assert git(repo, "rev-parse", "grid/y").strip() == y_branch_before
        assert marker_commits(repo, "grid/y") == []
        worktree = Path(str(failed["worktree"]))
        assert "shared.txt" in git(worktree, "ls-files", "-u")  # as the agent left it
        stopped = [e.data for e in event_log(c, types={"agent.failed"})]
        assert stopped and stopped[-1]["taskId"] == "y"


# -- marker-like lines on purpose ---------------------------------------------------------------


def test_a_fixture_with_marker_lines_allowed_by_config_merges(repo: Path, logdir: Path) -> None:
    configure(repo, logdir, merge={"allow_markers": ["tests/fixtures/*.txt"]})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", task("fx", {"tests/fixtures/conflict.txt": MARKED}))
        c.post("/session/start", {"featureBranch": "feature/fixtures", "onConflict": "human"})
        reviewed = wait_task_status(c, "fx", "review")
        assert reviewed["changedFiles"] == ["tests/fixtures/conflict.txt"]
        c.post("/tasks/fx/approve")
        wait_task_status(c, "fx", "done")
        assert git(repo, "show", "feature/fixtures:tests/fixtures/conflict.txt") == MARKED


def test_markers_are_refused_by_the_merge_until_the_approve_accepts_them(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", task("fx", {"docs/git.txt": MARKED}))
        c.post("/session/start", {"featureBranch": "feature/docs", "onConflict": "human"})
        # not allowed by the config: the finisher holds it for a human, who sends it on
        blocked = wait_task_status(c, "fx", "blocked")
        assert blocked["conflictUnresolved"] == ["docs/git.txt"]
        question = wait_pending_question(c, "fx")
        c.post(f"/questions/{question['id']}/answer", {"response": "review anyway"})
        wait_task_status(c, "fx", "review")
        before = git(repo, "rev-parse", "feature/docs").strip()
        c.post("/tasks/fx/approve")
        refused = wait_for(
            lambda: event_log(c, types={"task.merge_refused"}), timeout=20, message="refusal"
        )
        assert refused[0].data["reason"] == "conflict_markers"
        assert refused[0].data["files"] == ["docs/git.txt"]
        back = wait_task_status(c, "fx", "review")
        assert back["conflictUnresolved"] == ["docs/git.txt"]
        assert git(repo, "rev-parse", "feature/docs").strip() == before
        done = gridctl(repo, "task", "approve", "fx", "--accept-markers", "docs/git.txt")
        assert done.returncode == 0, done.stderr
        merged = wait_task_status(c, "fx", "done")
        assert merged["conflictUnresolved"] == []
        assert git(repo, "show", "feature/docs:docs/git.txt") == MARKED
        queued = [e.data for e in event_log(c, types={"task.merge_queued"})]
        assert queued[-1]["acceptMarkers"] == ["docs/git.txt"]
        assert "acceptMarkers" not in queued[0]


# -- the worktree is gridd's own -------------------------------------------------------------------


def test_a_worktree_repointed_at_the_main_repository_is_never_committed_in(repo: Path) -> None:
    # The agent points its worktree's .git at the user's repository and leaves a file:
    # committing "its work" there would land on the user's checked-out branch.
    script = 'echo "gitdir: $GRID_WORKSPACE/.git" > .git && echo stray > stray.txt'
    write_core_config(
        repo,
        agents={"rogue": {"command": ["sh", "-c", script]}},
        scheduler={"default_agent": "rogue"},
    )
    main_before = git(repo, "rev-parse", "main").strip()
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "r", "title": "rogue", "maxAttempts": 1})
        c.post("/session/start", {"featureBranch": "feature/rogue"})
        blocked = wait_task_status(c, "r", "blocked")
        assert "no longer the worktree gridd made" in str(blocked["error"])
        assert git(repo, "rev-parse", "main").strip() == main_before
        assert git(repo, "status", "--porcelain", "--", "stray.txt") == ""  # nothing staged
        failed = [e.data for e in event_log(c, types={"agent.finish_failed"})]
        assert failed and "no longer the worktree gridd made" in failed[0]["error"]
