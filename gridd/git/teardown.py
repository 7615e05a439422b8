"""After a merge: a task's worktree goes only when it is clean and fully merged, and its
branch only when asked to (``[merge] delete_branch``) and the feature branch contains it.

The merge queue tears down each merged task between merges (``MergeQueue._teardown``);
what a worktree is and how one is made or set aside is ``worktrees.py``'s.
"""

from __future__ import annotations

from pathlib import Path

from gridd.events import EventBus
from gridd.git.worktrees import GitError, Worktrees, branch_tip, git
from gridd.model import Task
from gridd.settings import MergeSettings
from gridd.state import GridState


class Teardown:
    def __init__(
        self, *, settings: MergeSettings, state: GridState, bus: EventBus, worktrees: Worktrees
    ) -> None:
        self.settings = settings
        self.state = state
        self.bus = bus
        self.worktrees = worktrees

    async def run(self, task: Task, feature: str) -> None:
        """Remove the worktree if clean and fully merged; the branch only if asked to."""
        if task.branch is None:
            return
        ref = f"refs/heads/{feature}"
        contained = (
            await git(
                self.worktrees.root,
                "merge-base",
                "--is-ancestor",
                f"refs/heads/{task.branch}",
                ref,
                check=False,
            )
        ).code == 0
        if not contained and task.changed_files:
            # squash and rebase: F holds the branch's version of every file it changed
            same = await git(
                self.worktrees.root,
                "diff",
                "--quiet",
                f"refs/heads/{task.branch}",
                ref,
                "--",
                *task.changed_files,
                check=False,
            )
            merged = same.code == 0
        else:
            merged = contained
        removed = False
        if self.settings.remove_worktree and merged and task.worktree:
            path = Path(task.worktree)
            if (path / ".git").exists() and not await self.worktrees.is_dirty(path):
                res = await git(
                    self.worktrees.root, "worktree", "remove", "--", str(path), check=False
                )
                removed = res.code == 0
        deleted = False
        if self.settings.delete_branch and contained and (removed or not task.worktree):
            head = await branch_tip(self.worktrees.root, task.branch)
            if head is None:
                raise GitError(f"the branch {task.branch} is gone", details={"branch": task.branch})
            res = await git(
                self.worktrees.root,
                "update-ref",
                "-d",
                f"refs/heads/{task.branch}",
                head,
                check=False,
            )
            deleted = res.code == 0
        if removed:
            self.state.update_task(task.id, worktree=None)
        self.bus.publish(
            "task.torn_down",
            {
                "taskId": task.id,
                "worktreeRemoved": removed,
                "branchDeleted": deleted,
                "branch": task.branch,
                "merged": merged,
            },
        )
