"""The merge queue: approved tasks enter the feature branch one at a time.

The queue is the tasks in status ``merging``, oldest approval first (``merge_queued_at``,
persisted with the task). For each, one merge at a time per workspace:

1. the integration worktree is reset to the feature branch's tip and the task's branch
   merged there (``integration.py``), then the gate check runs on the result;
2. the would-be commit is recorded on the task (``merge_commit``), then the feature branch
   moves by compare-and-swap, ``git update-ref refs/heads/F new old``. If the user committed
   to F meanwhile the swap fails and the merge is done again on top: their commits are
   never reset;
3. only then is the task ``done`` (``task.merged``).

A daemon killed anywhere in this leaves nothing half-applied: before the swap, F is
untouched and the merge is simply redone; after it, the recorded ``merge_commit`` is
reachable from F and the task is marked done on resume. A conflict or a failed check is
handed to the session's ``on_conflict`` policy (``conflicts.py``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from gridd.background import Background
from gridd.errors import GriddError
from gridd.events import EventBus
from gridd.git.conflicts import ConflictPolicy
from gridd.git.feature import checked_out_at, commit_of
from gridd.git.integration import Conflicted, Integration
from gridd.lifecycle import move_task
from gridd.model import Task, TaskStatus
from gridd.settings import MergeSettings
from gridd.state import GridState
from gridd.worktrees import Worktrees, git

log = logging.getLogger(__name__)

#: Compare-and-swap rounds before giving up for now (the user keeps committing to F).
CAS_ROUNDS = 5
#: Pause before trying a task again after a transient failure (a git lock, say).
RETRY_SECONDS = 2.0


def queue_order(tasks: list[Task]) -> list[Task]:
    """The merge queue (PURE): tasks in ``merging``, oldest approval first."""
    merging = [t for t in tasks if t.status == TaskStatus.MERGING]
    return sorted(merging, key=lambda t: (t.merge_queued_at or t.updated_at, t.id))


@dataclass
class PauseSeam:
    """A test seam: while ``path`` exists, the queue waits between the merge and the ref
    update (and says so by creating ``path.reached``). Off unless the daemon is given it."""

    path: Path | None = None

    async def wait(self) -> None:
        if self.path is None or not self.path.exists():
            return
        self.path.with_name(self.path.name + ".reached").touch()
        while self.path.exists():
            await asyncio.sleep(0.05)


class MergeQueue:
    def __init__(
        self,
        *,
        settings: MergeSettings,
        state: GridState,
        bus: EventBus,
        worktrees: Worktrees,
        integration_dir: Path,
        policy: ConflictPolicy,
        background: Background,
        pause: PauseSeam | None = None,
    ) -> None:
        self.settings = settings
        self.state = state
        self.bus = bus
        self.worktrees = worktrees
        self.root = worktrees.root
        self.integration = Integration(worktrees, integration_dir)
        self.policy = policy
        self.background = background
        self.pause = pause or PauseSeam()
        self._wake = asyncio.Event()
        self.current: str | None = None  # the task being merged
        self._retry_at: dict[str, float] = {}
        self._teardowns: list[str] = []  # merged tasks whose worktree is yet to go
        state.on_change(self._wake.set)

    def start(self) -> None:
        self.background.supervise("merge-queue", self.run)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            queued = queue_order(list(self.state.tasks.values()))
            due = [t for t in queued if self._retry_at.get(t.id, 0.0) <= now]
            if not due:
                # Teardown waits for a quiet queue: it is housekeeping, not the merge's cost.
                if self._teardowns:
                    await self._teardown(self._teardowns.pop(0))
                    continue  # look at the queue again between two teardowns
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), 1.0 if queued else 30.0)
                except TimeoutError:
                    pass
                continue
            task = due[0]
            self.current = task.id
            try:
                await self.merge_one(task)
                self._retry_at.pop(task.id, None)
                self._teardowns.append(task.id)
            except Exception as exc:  # not CancelledError: a stopping daemon resumes it later
                message = exc.message if isinstance(exc, GriddError) else repr(exc)
                log.warning("merging task %s: %s; trying again shortly", task.id, message)
                self.bus.publish("task.merge_retry", {"taskId": task.id, "error": message[:2000]})
                self._retry_at[task.id] = loop.time() + RETRY_SECONDS
            finally:
                self.current = None
                self.state.flush()

    # -- one merge ---------------------------------------------------------------------------

    async def merge_one(self, task: Task) -> None:
        feature = self.state.session.feature_branch
        if feature is None or task.branch is None:
            self._done(task, commit=None, feature=feature)  # nothing to merge into, or from
            return
        ref = f"refs/heads/{feature}"
        if task.merge_commit and await self._reachable(task.merge_commit, ref):
            # A daemon died after moving F and before recording it: only the record is missing.
            self._done(task, commit=task.merge_commit, feature=feature)
            return
        for _ in range(CAS_ROUNDS):
            tip = await commit_of(self.root, feature)
            if tip is None:
                raise GriddError(f"feature branch {feature!r} is gone", code="feature_missing")
            result = await self.integration.merge(
                tip=tip,
                branch=task.branch,
                strategy=self.settings.strategy,
                task_id=task.id,
                title=task.title,
            )
            if isinstance(result, Conflicted):
                await self.policy.conflict(task, files=result.files, feature_commit=tip)
                return
            if self.settings.check:
                check = await self.integration.check(
                    self.settings.check, self.settings.check_timeout_seconds
                )
                if not check.ok:
                    await self.policy.check_failed(task, output=check.output, feature_commit=tip)
                    return
            new = result.commit
            # merge and squash commit on top of tip; a rebase could end elsewhere (an
            # up-to-date branch): never move F to a commit that drops anything of it.
            rebased = self.settings.strategy == "rebase"
            if rebased and new != tip and not await self._reachable(tip, new):
                raise GriddError(
                    f"the merge of {task.id} does not contain the feature branch's tip",
                    code="merge_not_descendant",
                )
            task = self.state.update_task(task.id, merge_commit=new)  # recorded progress
            await self.pause.wait()
            holder = await checked_out_at(self.root, feature)
            if holder is not None:
                raise GriddError(
                    f"{feature!r} is checked out in {holder}; the merge waits until it is not",
                    code="branch_checked_out",
                )
            swap = await git(self.root, "update-ref", ref, new, tip, check=False)
            if swap.code == 0:
                self._done(task, commit=new, feature=feature)
                return
            log.info("%s moved during the merge of %s; merging again", feature, task.id)
        raise GriddError(
            f"feature branch {feature!r} kept moving during the merge of {task.id}",
            code="feature_moving",
        )

    async def _reachable(self, commit: str, ref: str) -> bool:
        res = await git(self.root, "merge-base", "--is-ancestor", commit, ref, check=False)
        return res.code == 0

    def _done(self, task: Task, *, commit: str | None, feature: str | None) -> None:
        move_task(
            self.state,
            task.id,
            TaskStatus.DONE,
            reason="merged",
            merge_commit=commit,
            merged_into=feature,
            merge_conflict=[],
            feedback=None,
            error=None,
        )
        self.bus.publish(
            "task.merged", {"taskId": task.id, "commit": commit, "featureBranch": feature}
        )
        self.state.flush()

    async def _teardown(self, task_id: str) -> None:
        task = self.state.tasks.get(task_id)
        feature = self.state.session.feature_branch
        if task is None or feature is None or task.status != TaskStatus.DONE:
            return
        try:
            await self.policy.teardown(task, feature)
        except GriddError as exc:  # the work is merged; a worktree left behind is harmless
            log.warning("tearing down %s: %s", task_id, exc.message)
