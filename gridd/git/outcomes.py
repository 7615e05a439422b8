"""A merging task's fate: decided under its gate, applied in one place.

The merge queue (``merge.py``) and the merge train (``batch.py``) reach the same few
outcomes for a task in ``merging``: it landed (``done``, ``task.merged``), it failed its
check alone (the ``on_conflict`` policy), its git timed out (``failed``), or it is no longer
the queue's (cancelled meanwhile: ``task.merge_abandoned``). Each is applied while holding
the task's ``MergeGate``, after one more look at its status under it.

A landing (``Outcomes.land``) holds the gate of every riding task across the
compare-and-swap of the feature branch, and waits while the branch is checked out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from gridd.events import EventBus
from gridd.git.landing import Held, Landing, Moved
from gridd.git.on_conflict import ConflictPolicy
from gridd.git.worktrees import GitTimeout, branch_tip, git
from gridd.lifecycle import move_task
from gridd.model import Task, TaskStatus
from gridd.state import GridState

log = logging.getLogger(__name__)

#: Pause between two tries to land a merge while F is checked out (or a git runs there).
LAND_RETRY_SECONDS = 0.1


def ids_of(tasks: Iterable[Task]) -> str:
    return ", ".join(t.id for t in tasks)


@dataclass
class PauseSeam:
    """A test seam: while ``path`` exists, the queue waits between the merge and the ref
    update (and says so by creating ``path.reached``); while ``path.landing`` exists, it
    waits inside the landing, holding the gate (``path.landing.reached``). Off unless the
    daemon is given it."""

    path: Path | None = None

    async def wait(self, point: str = "") -> None:
        if self.path is None:
            return
        path = self.path.with_name(f"{self.path.name}.{point}") if point else self.path
        if not path.exists():
            return
        path.with_name(path.name + ".reached").touch()
        while path.exists():
            await asyncio.sleep(0.05)


class MergeGate:
    """Who decides a merging task's fate right now: the queue, while it applies an outcome
    (a merge landing, a conflict handed to the policy, a failure), or a command. Commands
    that may move a merging task (cancel, stop, reject) wait until the queue is through
    with it, then look at its status: the queue never changes a status it has not just
    seen under the gate, so the two never both win."""

    def __init__(self) -> None:
        self._deciding: dict[str, asyncio.Event] = {}

    @asynccontextmanager
    async def deciding(self, task_id: str) -> AsyncIterator[None]:
        done = asyncio.Event()
        self._deciding[task_id] = done
        try:
            yield
        finally:
            del self._deciding[task_id]
            done.set()

    async def settled(self, task_id: str) -> None:
        """Return once the queue is not deciding ``task_id``'s fate (at once, mostly)."""
        while (busy := self._deciding.get(task_id)) is not None:
            await busy.wait()


class Outcomes:
    def __init__(
        self,
        *,
        state: GridState,
        bus: EventBus,
        root: Path,
        landing: Landing,
        policy: ConflictPolicy,
        gate: MergeGate,
        pause: PauseSeam,
        git_timeout: float,
    ) -> None:
        self.state = state
        self.bus = bus
        self.root = root
        self.landing = landing
        self.policy = policy
        self.gate = gate
        self.pause = pause
        self.timeout = git_timeout

    def merging(self, task_id: str) -> Task | None:
        """The task, if it is still the queue's to merge (a cancel may have taken it)."""
        task = self.state.tasks.get(task_id)
        return task if task is not None and task.status == TaskStatus.MERGING else None

    async def land(self, rides: list[tuple[Task, str]], *, feature: str, tip: str) -> bool:
        """Move F from ``tip`` to the last ride's commit and mark every riding task done
        (each with its own merge commit), waiting while F is checked out. False: finished
        here (landed, or abandoned: then nobody lands); True: F moved, merge again."""
        new = rides[-1][1]
        waiting_for: tuple[str, str] | None = None
        while True:
            async with AsyncExitStack() as held:
                for task, _ in rides:
                    await held.enter_async_context(self.gate.deciding(task.id))
                current = [(self.merging(task.id), commit) for task, commit in rides]
                gone = [
                    task.id
                    for (task, _), (now, commit) in zip(rides, current, strict=True)
                    if now is None or now.merge_commit != commit
                ]
                if gone:
                    for task_id in gone:
                        self.abandoned(task_id, feature)
                    return False  # the others are merged again without it
                if self.state.session.feature_branch != feature:
                    return False  # the session moved on: merged again into its new branch
                await self.pause.wait("landing")
                outcome = await self.landing.land(feature, new=new, old=tip)
                if isinstance(outcome, Moved):
                    return True
                if not isinstance(outcome, Held):
                    for now, commit in current:
                        assert now is not None
                        self.done(now, commit=commit, feature=feature)
                    return False
            if waiting_for != (outcome.worktree, outcome.reason):
                waiting_for = (outcome.worktree, outcome.reason)
                log.info("the merge of %s waits: %s", ids_of(t for t, _ in rides), outcome.message)
                for task, _ in rides:
                    self.bus.publish(
                        "task.merge_waiting",
                        {
                            "taskId": task.id,
                            "featureBranch": feature,
                            "worktree": outcome.worktree,
                            "reason": outcome.reason,
                        },
                    )
            await asyncio.sleep(LAND_RETRY_SECONDS)
            while not await self.landing.looks_clear(feature):
                if (
                    any(self.merging(task.id) is None for task, _ in rides)
                    or self.state.session.feature_branch != feature
                ):
                    break  # the next round says why (under the gate)
                await asyncio.sleep(LAND_RETRY_SECONDS)

    async def blame(self, task_id: str, *, output: str, feature: str) -> None:
        """The task fails the gate without the others: back through the policy."""
        tip = await branch_tip(self.root, feature, timeout=self.timeout) or ""
        async with self.gate.deciding(task_id):
            task = self.state.tasks.get(task_id)
            if task is None or self.abandoned(task_id, feature):
                return
            await self.policy.check_failed(task, output=output, feature_commit=tip)

    def abandoned(self, task_id: str, feature: str) -> bool:
        """True (and said once) when the task is no longer the queue's: cancelled, say."""
        task = self.state.tasks.get(task_id)
        if task is not None and task.status == TaskStatus.MERGING:
            return False
        status = task.status.value if task is not None else "gone"
        log.info("the merge of %s is abandoned: the task is %s", task_id, status)
        self.bus.publish(
            "task.merge_abandoned",
            {"taskId": task_id, "featureBranch": feature, "status": status},
        )
        return True

    async def reachable(self, commit: str, ref: str) -> bool:
        res = await git(
            self.root,
            "merge-base",
            "--is-ancestor",
            commit,
            ref,
            check=False,
            timeout=self.timeout,
        )
        return res.code == 0

    def done(self, task: Task, *, commit: str | None, feature: str | None) -> None:
        move_task(
            self.state,
            task.id,
            TaskStatus.DONE,
            reason="merged",
            merge_commit=commit,
            merged_into=feature,
            merge_conflict=[],
            conflict_unresolved=[],
            feedback=None,
            error=None,
        )
        self.bus.publish(
            "task.merged", {"taskId": task.id, "commit": commit, "featureBranch": feature}
        )
        self.state.flush()

    async def fail(self, task: Task, exc: GitTimeout) -> None:
        """A merge stopped by its timeout: the task fails with the reason, F untouched."""
        log.warning("merging task %s: %s", task.id, exc.message)
        async with self.gate.deciding(task.id):
            if self.merging(task.id) is None:
                return
            move_task(
                self.state,
                task.id,
                TaskStatus.FAILED,
                reason="the merge timed out",
                error=exc.message,
                merge_commit=None,
            )
            self.bus.publish(
                "task.merge_failed",
                {
                    "taskId": task.id,
                    "featureBranch": self.state.session.feature_branch,
                    "code": exc.code,
                    "error": exc.message[:2000],
                },
            )
