"""Which workspace a directory belongs to: the git top level, except inside the worktrees
gridd makes under ``<root>/.grid/``, which belong to ``<root>`` and its daemon."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.errors import WorkspaceError
from gridd.workspace import find_workspace
from tests.support.cli import gridctl, run_gridd
from tests.support.daemons import core_daemon, running_daemon, stop_workspace
from tests.support.git import git
from tests.support.processes import daemons_serving
from tests.support.repos import (
    agent_command,
    make_repo,
    read_json_file,
    remove_repo,
    write_core_config,
)
from tests.support.waits import wait_for


def task_worktree(root: Path, task_id: str = "t1") -> Path:
    """A worktree made as gridd makes a task's (``git/worktrees.py``)."""
    path = root / ".grid" / "worktrees" / task_id
    path.parent.mkdir(parents=True, exist_ok=True)
    git(root, "worktree", "add", "-q", "-b", f"grid/{task_id}", "--", str(path), "HEAD")
    return path


@pytest.fixture
def other_repo() -> Iterator[Path]:
    root = make_repo()
    yield root
    remove_repo(root)


def test_a_task_worktree_and_its_subdirectories_belong_to_the_workspace_that_made_it(
    repo: Path,
) -> None:
    worktree = task_worktree(repo)
    (worktree / "src" / "deep").mkdir(parents=True)
    assert find_workspace(worktree).root == repo
    assert find_workspace(worktree / "src" / "deep").root == repo


def test_the_integration_worktree_belongs_to_its_workspace(repo: Path) -> None:
    integration = repo / ".grid" / "integration"
    repo.joinpath(".grid").mkdir()
    git(repo, "worktree", "add", "-q", "--detach", "--", str(integration), "HEAD")
    assert find_workspace(integration).root == repo


def test_a_speculative_integration_worktree_belongs_to_its_workspace(repo: Path) -> None:
    # [merge] gate_concurrency: a gate in the third slot calling gridctl reaches this daemon
    slot = repo / ".grid" / "integration-3"
    repo.joinpath(".grid").mkdir()
    git(repo, "worktree", "add", "-q", "--detach", "--", str(slot), "HEAD")
    assert find_workspace(slot).root == repo


def test_a_worktree_the_user_added_elsewhere_stays_a_workspace_of_its_own(repo: Path) -> None:
    elsewhere = Path(tempfile.mkdtemp(prefix="u", dir="/tmp")) / "wt"
    try:
        git(repo, "worktree", "add", "-q", "-b", "mine", "--", str(elsewhere), "HEAD")
        assert find_workspace(elsewhere).root == elsewhere
        inside = repo / "nested-wt"  # under the repository, but not under .grid/
        git(repo, "worktree", "add", "-q", "-b", "mine2", "--", str(inside), "HEAD")
        assert find_workspace(inside).root == inside
    finally:
        remove_repo(elsewhere.parent)


def test_a_repository_that_is_not_a_worktree_of_the_workspace_stays_its_own(
    repo: Path, other_repo: Path
) -> None:
    # Shaped like a task worktree, but a repository of its own...
    separate = repo / ".grid" / "worktrees" / "separate"
    separate.mkdir(parents=True)
    git(separate, "init", "-q")
    assert find_workspace(separate).root == separate
    # ...or a worktree of another repository.
    foreign = repo / ".grid" / "worktrees" / "foreign"
    git(other_repo, "worktree", "add", "-q", "-b", "x", "--", str(foreign), "HEAD")
    assert find_workspace(foreign).root == foreign


def test_a_symlink_loop_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    loop = tmp_path / "a"
    loop.symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(loop)
    with pytest.raises(WorkspaceError, match="cannot resolve the workspace path"):
        find_workspace(loop)
    result = gridctl(tmp_path, "--workspace", str(loop), "status")
    assert result.returncode == 1
    assert result.stderr.startswith("gridctl: cannot resolve the workspace path")
    assert "Traceback" not in result.stderr


def test_a_repository_whose_path_is_not_utf8_is_found() -> None:
    parent = Path(tempfile.mkdtemp(prefix="n", dir="/tmp"))
    root = parent / os.fsdecode(b"r\xff")
    try:
        root.mkdir()
        git(root, "init", "-q")
        assert find_workspace(root).root == root
    finally:
        remove_repo(parent)


def test_gridctl_and_gridd_in_a_task_worktree_reach_the_workspace_daemon(repo: Path) -> None:
    worktree = task_worktree(repo)
    try:
        with running_daemon(repo) as daemon:
            status = gridctl(repo, "status", cwd=worktree)
            assert status.returncode == 0, status.stderr
            assert f"workspace {repo}\n" in status.stdout
            assert f"pid {daemon.proc.pid} " in status.stdout
            assert "started gridd" not in status.stderr
            refused = run_gridd(worktree)
            assert refused.returncode == 1
            assert f"already running for {repo} " in refused.stderr
        assert not (worktree / ".grid").exists()
        assert not daemons_serving(worktree)
    finally:
        stop_workspace(worktree)


def test_an_agent_calling_gridctl_in_its_worktree_talks_to_the_daemon_running_it(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        agents={"caller": {"command": agent_command("call_gridctl.py", str(tmp_path), "status")}},
    )
    worktree = repo / ".grid" / "worktrees" / "calls"
    try:
        with core_daemon(repo) as daemon:
            c = daemon.client()
            c.post("/tasks", {"id": "calls", "title": "t", "prompt": "p", "agent": "caller"})
            c.post("/tasks/calls/start")
            report = wait_for(lambda: read_json_file(tmp_path / "calls.gridctl.json"), timeout=60)
            assert report["code"] == 0, report["stderr"]
            assert f"workspace {repo}\n" in str(report["stdout"])
            assert f"pid {daemon.proc.pid} " in str(report["stdout"])
            assert "started gridd" not in str(report["stderr"])
            assert not (worktree / ".grid").exists()
    finally:
        stop_workspace(worktree)
