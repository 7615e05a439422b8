"""Merges that cannot be raced, on real repositories and real daemons: a cancel at the
crash point between the merge and the ref update either wins (the work never reaches the
feature branch) or finds the task done and says so; a user checking the feature branch
out while merges run never sees it move under their checkout, and every merge lands once
they leave it; a git call that hangs (a filter driver) fails its merge, and the queue goes
on."""

from __future__ import annotations

import asyncio
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gridd.errors import Conflict
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for


def configure(root: Path, merge: str = "") -> None:
    write_core_config(
        root,
        agents={"work": {"command": agent_command("trivial.py")}},
        scheduler={"default_agent": "work", "max_attempts": 1},
    )
    if merge:
        with (root / ".grid" / "config.toml").open("a") as fh:
            fh.write(f"\n[merge]\n{merge}\n")


def run_git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def files_on(root: Path, ref: str) -> set[str]:
    return set(git(root, "ls-tree", "-r", "--name-only", ref).split())


@pytest.fixture
def pause(repo: Path) -> Iterator[Path]:
    """The merge queue's pause seam (``GRIDD_TEST_MERGE_PAUSE``), removed afterwards."""
    path = repo.parent / (repo.name + ".pause")
    yield path
    for leftover in path.parent.glob(path.name + "*"):
        leftover.unlink(missing_ok=True)


def illegal_moves(log_text: str) -> list[str]:
    return [line for line in log_text.splitlines() if "illegal" in line.lower()]


# -- cancel against the ref update --------------------------------------------------------------


def test_a_cancel_at_the_crash_point_wins_and_the_work_never_reaches_the_branch(
    repo: Path, pause: Path
) -> None:
    configure(repo)
    with core_daemon(repo, env={"GRIDD_TEST_MERGE_PAUSE": str(pause)}) as daemon:
        c = daemon.client()
        c.post(
            "/plans", {"tasks": [{"id": "k", "title": "cancelled"}, {"id": "n", "title": "next"}]}
        )
        c.post("/session/start", {"featureBranch": "feature/cancel", "maxAgents": 2})
        wait_task_status(c, "k", "review")
        wait_task_status(c, "n", "review")
        before = git(repo, "rev-parse", "feature/cancel").strip()
        pause.touch()
        c.post("/tasks/k/approve")
        wait_for(pause.with_name(pause.name + ".reached").exists, timeout=20)
        assert c.get("/tasks/k")["mergeCommit"]  # merged in the integration worktree
        cancelled = c.request("DELETE", "/tasks/k")
        assert cancelled["status"] == "cancelled"
        c.post("/tasks/n/approve")  # queued behind k: once n is merged, k has been seen to
        pause.unlink()
        wait_task_status(c, "n", "done")
        assert c.get("/tasks/k")["status"] == "cancelled"
        head = git(repo, "rev-parse", "feature/cancel").strip()
        assert git(repo, "rev-parse", f"{head}^1").strip() == before  # n's merge only
        assert "k.txt" not in files_on(repo, head)
        assert "n.txt" in files_on(repo, head)
        merged = [e.data["taskId"] for e in event_log(c, types={"task.merged"})]
        assert merged == ["n"]
        assert not [e for e in event_log(c, types={"task.merge_retry"}) if e.data["taskId"] == "k"]
        assert illegal_moves(daemon.stderr_text()) == []


def test_cancel_stop_and_reject_while_the_merge_lands_find_the_task_done_and_answer_409(
    repo: Path, pause: Path
) -> None:
    configure(repo)
    landing = pause.with_name(pause.name + ".landing")
    with core_daemon(repo, env={"GRIDD_TEST_MERGE_PAUSE": str(pause)}) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "k", "title": "lands anyway"})
        c.post("/session/start", {"featureBranch": "feature/late"})
        wait_task_status(c, "k", "review")
        landing.touch()
        c.post("/tasks/k/approve")
        wait_for(landing.with_name(landing.name + ".reached").exists, timeout=20)
        answers: dict[str, object] = {}
        asks = {
            "cancel": ("DELETE", "/tasks/k", None),
            "stop": ("POST", "/tasks/k/stop", None),
            "reject": ("POST", "/tasks/k/reject", {"feedback": "no"}),
        }

        def ask(name: str) -> None:
            method, path, body = asks[name]
            with daemon.client() as own:
                try:
                    answers[name] = own.request(method, path, json=body)
                except Conflict as exc:
                    answers[name] = exc

        threads = [threading.Thread(target=ask, args=(name,)) for name in asks]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # they reach the daemon while the merge lands (or just after: the
        landing.unlink()  # answers must be the same)
        for thread in threads:
            thread.join(timeout=20)
        task = c.get("/tasks/k")
        assert task["status"] == "done"
        codes = {
            "cancel": "task_finished",
            "stop": "task_not_working",
            "reject": "task_not_in_review",
        }
        for name, code in codes.items():
            answer = answers[name]
            assert isinstance(answer, Conflict), (name, answer)
            assert answer.code == code
            assert answer.details == {
                "id": "k",
                "status": "done",
                "mergeCommit": task["mergeCommit"],
            }
        head = git(repo, "rev-parse", "feature/late").strip()
        assert head == task["mergeCommit"]
        assert "k.txt" in files_on(repo, head)
        assert illegal_moves(daemon.stderr_text()) == []


def test_locks_left_by_a_landing_whose_daemon_died_are_removed_at_start(repo: Path) -> None:
    configure(repo)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    left = [repo / ".git" / "index.lock", repo / ".git" / "HEAD.lock"]
    for lock in left:
        lock.write_text(f"gridd landing pid={gone.pid}\n")
    other = repo.parent / (repo.name + "-other")
    git(repo, "worktree", "add", "-q", "-b", "elsewhere", str(other))
    try:
        gitdir = Path(git(other, "rev-parse", "--absolute-git-dir").strip())
        foreign = gitdir / "index.lock"  # a git of the user's: never ours to remove
        foreign.write_text("DIRC")
        with core_daemon(repo):
            wait_for(lambda: not any(lock.exists() for lock in left), timeout=15)
            assert foreign.exists()
            assert run_git(repo, "checkout", "-q", "-b", "after").returncode == 0
    finally:
        foreign.unlink(missing_ok=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(other)])


# -- a user's checkout against the ref update ---------------------------------------------------


def test_the_feature_branch_never_moves_under_a_checkout_and_every_merge_lands_after(
    repo: Path,
) -> None:
    configure(repo)
    ids = [f"t{i}" for i in range(16)]
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/plans", {"tasks": [{"id": i, "title": f"task {i}"} for i in ids]})
        c.post("/session/start", {"featureBranch": "feature/co", "maxAgents": 4})
        for task_id in ids:
            wait_task_status(c, task_id, "review", timeout=60)
        start = git(repo, "rev-parse", "feature/co").strip()
        for task_id in ids:
            c.post(f"/tasks/{task_id}/approve")
        # The user flips between the feature branch and main while the merges run, now and
        # then staying on main for a while (so merges land in between). Each time the
        # feature branch is checked out, it must stay where it was and match the index.
        pauses = random.Random(22)
        violations: list[str] = []
        checkouts = refused = 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if run_git(repo, "checkout", "-q", "feature/co").returncode != 0:
                refused += 1  # a merge landing held the index: git refused, nothing changed
                assert git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
                continue
            checkouts += 1
            at_checkout = git(repo, "rev-parse", "feature/co").strip()
            if run_git(repo, "diff", "--cached", "--quiet").returncode != 0:
                violations.append(f"checkout {checkouts}: the index differs from the branch")
            if git(repo, "rev-parse", "feature/co").strip() != at_checkout:
                violations.append(f"checkout {checkouts}: the branch moved while checked out")
            # -f: a violation would leave staged changes behind; keep the loop going. Back to
            # main until git agrees: a landing's locks fail this checkout too, and staying on
            # the branch would make the next checkout's refusal look like a move.
            wait_for(lambda: run_git(repo, "checkout", "-q", "-f", "main").returncode == 0)
            time.sleep(pauses.choice((0.0, 0.0, 0.0, 0.7)))
        wait_for(lambda: run_git(repo, "checkout", "-q", "-f", "main").returncode == 0)
        assert violations == []
        assert checkouts >= 10, (checkouts, refused)
        # Every merge lands once the user has left the branch.
        for task_id in ids:
            wait_task_status(c, task_id, "done", timeout=60)
        head = git(repo, "rev-parse", "feature/co").strip()
        assert {f"{i}.txt" for i in ids} <= files_on(repo, head)
        git(repo, "merge-base", "--is-ancestor", start, head)
        assert git(repo, "status", "--porcelain", "--", ":!.gridd-test-stderr").strip() == ""
        waits = event_log(c, types={"task.merge_waiting"})
        assert waits, "no merge had to wait: the checkouts did not race the merges"
        assert illegal_moves(daemon.stderr_text()) == []


# -- a git call that hangs ----------------------------------------------------------------------


def test_a_hanging_filter_fails_its_merge_by_the_timeout_and_the_next_task_merges(
    repo: Path,
) -> None:
    configure(repo, merge="git_timeout_seconds = 3")
    hang = repo.parent / (repo.name + "-hang.sh")
    hang.write_text("sleep 90\ncat\n")
    try:
        (repo / ".gitattributes").write_text("slow*.txt filter=hang\n")
        git(repo, "add", ".gitattributes")
        git(repo, "commit", "-q", "-m", "a filter that hangs on checkout")
        git(repo, "config", "filter.hang.smudge", f"sh {hang}")
        with core_daemon(repo) as daemon:
            c = daemon.client()
            c.post(
                "/plans",
                {"tasks": [{"id": "slow", "title": "hangs"}, {"id": "fast", "title": "ok"}]},
            )
            c.post("/session/start", {"featureBranch": "feature/hang", "maxAgents": 2})
            wait_task_status(c, "slow", "review")
            wait_task_status(c, "fast", "review")
            before = git(repo, "rev-parse", "feature/hang").strip()
            c.post("/tasks/slow/approve")
            c.post("/tasks/fast/approve")
            failed = wait_task_status(c, "slow", "failed", timeout=30)
            assert "did not finish within 3 s" in str(failed["error"])
            [event] = [e.data for e in event_log(c, types={"task.merge_failed"})]
            assert event["taskId"] == "slow" and event["code"] == "git_timeout"
            done = wait_task_status(c, "fast", "done", timeout=30)
            head = git(repo, "rev-parse", "feature/hang").strip()
            assert done["mergeCommit"] == head
            assert git(repo, "rev-parse", f"{head}^1").strip() == before
            assert "slow.txt" not in files_on(repo, head)
            # the filter went with the git that ran it
            assert filter_processes(hang) == []
    finally:
        for proc in filter_processes(hang):  # what a failed test left: its filter only
            for child in proc.children(recursive=True):
                child.kill()
            proc.kill()
        hang.unlink(missing_ok=True)


def filter_processes(script: Path) -> list[psutil.Process]:
    """The running filter drivers started from ``script`` (``sh <script>``)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if str(script) in proc.cmdline():
                found.append(proc)
        except psutil.Error:
            continue
    return found


# -- the landing itself -------------------------------------------------------------------------


def test_a_branch_being_rebased_in_a_linked_worktree_counts_as_checked_out(repo: Path) -> None:
    from gridd.git.landing import Held, Landed, Landing

    other = repo.parent / (repo.name + "-rebasing")
    git(repo, "checkout", "-q", "-b", "feature/rb")
    (repo / "a.txt").write_text("feature\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "feature side")
    git(repo, "checkout", "-q", "main")
    (repo / "a.txt").write_text("main\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "main side")
    old = git(repo, "rev-parse", "feature/rb").strip()
    new = git(repo, "commit-tree", f"{old}^{{tree}}", "-p", old, "-m", "merged").strip()
    git(repo, "worktree", "add", "-q", str(other), "feature/rb")
    try:
        # the rebase stops on the conflict: HEAD is detached, the branch is still being worked on
        assert run_git(other, "rebase", "main").returncode != 0
        landing = Landing(repo, own=(repo / ".grid",), git_timeout=30)

        def land() -> Landed | Held:
            # an index written in the last half second is busy: asked again until quiet
            outcome = wait_for(
                lambda: (
                    (found := asyncio.run(landing.land("feature/rb", new=new, old=old)))
                    and not (isinstance(found, Held) and found.reason == "busy")
                    and found
                ),
                timeout=10,
            )
            assert isinstance(outcome, Landed | Held)
            return outcome

        held = land()
        assert isinstance(held, Held) and held.reason == "checked_out"
        assert held.worktree == str(other)
        assert git(repo, "rev-parse", "feature/rb").strip() == old
        git(other, "rebase", "--abort")
        git(other, "checkout", "-q", "--detach")
        assert isinstance(land(), Landed)
        assert git(repo, "rev-parse", "feature/rb").strip() == new
        assert not (repo / ".git" / "index.lock").exists()
        assert not (repo / ".git" / "HEAD.lock").exists()
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(other)])
