"""A gridd started with another repository's ``GIT_DIR`` in its environment (from a git hook,
an alias, ``git bisect run``) serves the workspace it was started in and never touches that
other repository: neither its config, its refs nor its worktrees."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import cli as support_cli
from tests.support.git import git
from tests.support.repos import make_repo, remove_repo
from tests.support.waits import wait_for


def test_a_gridd_started_under_another_repositorys_git_dir_leaves_that_repository_alone(
    ws: Path,
) -> None:
    decoy = make_repo()
    try:
        config_before = (decoy / ".git" / "config").read_text()
        refs_before = git(decoy, "for-each-ref")
        env = {
            **support_cli.GRIDCTL_ENV,
            "GRID_EXAMPLE_DELAY": "0",
            "GIT_DIR": str(decoy / ".git"),
            "GIT_WORK_TREE": str(decoy),
            "GIT_INDEX_FILE": str(decoy / ".git" / "index"),
        }
        added = support_cli.gridctl(ws, "task", "add", "x", "--prompt", "make x", env=env)
        assert added.returncode == 0, added.stderr
        task = added.stdout.split()[2]  # "created task <id> (ready)"
        started = support_cli.gridctl(ws, "session", "start", "--branch", "feat", env=env)
        assert started.returncode == 0, started.stderr

        def status() -> str:
            listed = support_cli.gridctl(ws, "task", "list", "--json", env=env)
            return str({t["id"]: t["status"] for t in json.loads(listed.stdout)}.get(task))

        wait_for(lambda: status() == "review", timeout=60, message=f"task {task} in review")
        assert (ws / ".grid" / "gridd.sock").exists()
        assert f"refs/heads/grid/{task}" in git(ws, "for-each-ref")
        assert (decoy / ".git" / "config").read_text() == config_before
        assert git(decoy, "for-each-ref") == refs_before
        assert not (decoy / ".grid").exists()
        assert git(decoy, "worktree", "list").count("\n") == 1
    finally:
        remove_repo(decoy)
