"""Review edits: what a reviewer changed in a task's worktree is kept, or the approve refused.

In the editor, the right side of a task's diff is its live worktree file: a reviewer who
fixes a line there and approves means the fix to be merged. At approve, any uncommitted
change in the task's worktree is therefore, by ``[merge] review_edits``:

- ``commit`` (the default): committed on the task's branch as a review commit, authored by
  the git identity of the user running the daemon (the repository's ``user.name`` and
  ``user.email``; else the login name at the host), message ``review edits`` with the
  trailer ``Grid-Review: <task>``; it is merged with the rest (``task.review_edits``);
- ``refuse``: the approve answers 409 ``worktree_dirty`` listing the files, and nothing
  changes: the reviewer commits or discards them, then approves again.

Either way nothing is lost.
"""

from __future__ import annotations

import os
import pwd
import socket
from dataclasses import dataclass
from pathlib import Path

from gridd.errors import Conflict
from gridd.git.integrity import ForeignWorktree, own_worktree
from gridd.git.worktrees import Worktrees, git
from gridd.model import Task


@dataclass(frozen=True)
class ReviewCommit:
    commit: str
    files: list[str]  # what the reviewer changed
    changed: list[str]  # the task's changed files against its base, the review included


def review_message(task_id: str) -> str:
    return f"review edits\n\nGrid-Review: {task_id}\n"


async def reviewer_identity(path: Path) -> tuple[str, ...]:
    """``-c user.*`` flags naming the daemon's user: none when git has its own identity."""
    name = (await git(path, "config", "--get", "user.name", check=False)).out.strip()
    email = (await git(path, "config", "--get", "user.email", check=False)).out.strip()
    if name and email:
        return ()
    entry = pwd.getpwuid(os.getuid())
    login = entry.pw_name
    full = entry.pw_gecos.split(",", 1)[0].strip()
    return (
        "-c",
        f"user.name={name or full or login}",
        "-c",
        f"user.email={email or f'{login}@{socket.gethostname()}'}",
    )


async def keep_review_edits(worktrees: Worktrees, task: Task, *, mode: str) -> ReviewCommit | None:
    """Commit (or, ``mode == "refuse"``, refuse with 409 ``worktree_dirty``) what is left
    uncommitted in ``task``'s worktree; None when there is nothing."""
    if not task.worktree or not (Path(task.worktree) / ".git").exists():
        return None
    path = Path(task.worktree)
    try:
        await own_worktree(worktrees.root, path)
    except ForeignWorktree as exc:
        raise Conflict(
            f"task {task.id!r} cannot be approved: {exc.message}",
            code="worktree_foreign",
            details=exc.details,
        ) from None
    files = await worktrees.dirty_files(path)
    if not files:
        return None
    if mode == "refuse":
        raise Conflict(
            f"task {task.id!r} has uncommitted changes in its worktree ({', '.join(files[:20])}):"
            " commit or discard them there, then approve again"
            ' (or set [merge] review_edits = "commit")',
            code="worktree_dirty",
            details={"files": files, "worktree": str(path)},
        )
    identity = await reviewer_identity(path)
    _, changed = await worktrees.record(
        path, review_message(task.id), base=task.base_commit, identity=identity
    )
    head = (await git(path, "rev-parse", "--verify", "HEAD^{commit}")).out.strip()
    return ReviewCommit(commit=head, files=files, changed=changed)
