"""A task's change: its branch against the commit it branched from (``GET /tasks/{id}/diff``).

Three git calls (``rev-parse``, ``diff --numstat``/``--name-status`` in one, the patch),
read-only, never touching a worktree. A patch larger than ``PATCH_LIMIT`` is cut, and says so.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gridd.errors import Conflict
from gridd.git.worktrees import branch_tip, git
from gridd.model import Task, WireModel

PATCH_LIMIT = 2 * 1024 * 1024


class DiffFile(WireModel):
    path: str
    status: str  # added | modified | deleted | renamed | copied | typechange
    additions: int | None = None  # None for binary files
    deletions: int | None = None


class TaskDiff(WireModel):
    task_id: str
    base: str
    head: str
    files: list[DiffFile] = Field(default_factory=list)
    patch: str = ""
    truncated: bool = False


_STATUS = {"A": "added", "M": "modified", "D": "deleted", "R": "renamed", "C": "copied"}


def parse_diff(name_status: str, numstat: str) -> list[DiffFile]:
    """``git diff -z --name-status`` and ``-z --numstat`` output -> files (PURE)."""
    files: dict[str, DiffFile] = {}
    parts = name_status.split("\0")
    i = 0
    while i < len(parts) - 1:
        code = parts[i]
        if not code:
            i += 1
            continue
        if code[0] in "RC":
            path = parts[i + 2]
            i += 3
        else:
            path = parts[i + 1]
            i += 2
        files[path] = DiffFile(path=path, status=_STATUS.get(code[0], "typechange"))
    fields = numstat.split("\0")
    j = 0
    while j < len(fields):
        head = fields[j]
        if not head:
            j += 1
            continue
        add, delete, path = ([*head.split("\t", 2), "", ""])[:3]
        if not path:  # a rename: the two paths follow as their own fields
            path = fields[j + 2] if j + 2 < len(fields) else ""
            j += 3
        else:
            j += 1
        if path in files:
            files[path] = files[path].model_copy(
                update={
                    "additions": int(add) if add.isdigit() else None,
                    "deletions": int(delete) if delete.isdigit() else None,
                }
            )
    return sorted(files.values(), key=lambda f: f.path)


async def task_diff(root: Path, task: Task) -> TaskDiff:
    if task.branch is None or task.base_commit is None:
        raise Conflict(
            f"task {task.id!r} has no branch yet (it has not run)",
            code="task_has_no_branch",
            details={"taskId": task.id, "status": task.status.value},
        )
    tip = await branch_tip(root, task.branch)
    if tip is None:
        raise Conflict(
            f"task {task.id!r}'s branch {task.branch} is gone",
            code="task_branch_missing",
            details={"taskId": task.id, "branch": task.branch},
        )
    head, base = tip, task.base_commit
    status = await git(root, "diff", "-z", "-M", "--name-status", base, head, "--")
    numstat = await git(root, "diff", "-z", "-M", "--numstat", base, head, "--")
    patch = await git(root, "diff", "-M", base, head, "--")
    text = patch.out
    truncated = len(text) > PATCH_LIMIT
    return TaskDiff(
        task_id=task.id,
        base=base,
        head=head,
        files=parse_diff(status.out, numstat.out),
        patch=text[:PATCH_LIMIT],
        truncated=truncated,
    )
