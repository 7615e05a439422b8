"""The merge queue: approved tasks enter the feature branch, one at a time or in trains.

The queue is the tasks in status ``merging``, oldest approval first (``merge_queued_at``,
persisted with the task). For each, one merge at a time per workspace:

1. the integration worktree is reset to the feature branch's tip and the task's branch
   merged there (``integration.py``), then the gate check runs on the result;
2. the would-be commit is recorded on the task (``merge_commit``), then the merge lands
   (``landing.py``): the feature branch moves by compare-and-swap, ``git update-ref
   refs/heads/F new old``, while no working tree has F checked out, the user's worktrees
   locked across the check and the update. If the user committed to F meanwhile the swap
   fails and the merge is done again on top: their commits are never reset. While F is
   checked out somewhere the merge waits, and lands once it is not;
3. only then is the task ``done`` (``task.merged``).

A merging task's fate is decided in one place at a time (``MergeGate``, ``outcomes.py``):
the queue holds the gate from its last look at the task's status to the status it sets
(landed: ``done``; conflict: the policy's), and cancel, stop and reject wait for it. So a
cancel either wins before the ref moves (the queue then sees a cancelled task and abandons
the merge, ``task.merge_abandoned``) or finds the task ``done`` and says so; never both.

Every git call of the queue has a timeout (``[merge] git_timeout_seconds``): a filter or
hook that hangs is stopped with its process group, the task fails with the reason
(``task.merge_failed``) and the queue goes on to the next one.

The merge train (``[merge] max_batch`` > 1): several waiting tasks merged in order into one
candidate, each with its own merge commit, gated once, landed by the same compare-and-swap
under the gate of every riding task; a failing candidate is bisected (``batch.py``; the
decision is ``train.py``), the task that fails alone goes to the policy, every other one
lands.

A daemon killed anywhere in this leaves nothing half-applied: before the swap, F is
untouched and the merge is simply redone; after it, the recorded ``merge_commit`` is
reachable from F and the task is marked done on resume. A conflict or a failed check is
handed to the session's ``on_conflict`` policy (``on_conflict.py``).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from gridd.background import Background
from gridd.errors import GriddError
from gridd.events import EventBus
from gridd.git.batch import CAS_ROUNDS, Batches
from gridd.git.candidate import Builder
from gridd.git.integration import Conflicted
from gridd.git.landing import Landing
from gridd.git.on_conflict import ConflictPolicy
from gridd.git.outcomes import MergeGate, Outcomes, PauseSeam, ids_of
from gridd.git.slots import Slots
from gridd.git.teardown import Teardown
from gridd.git.worktrees import GitTimeout, Worktrees, branch_tip
from gridd.model import MergeTrain, Task, TaskStatus, utcnow
from gridd.settings import MergeSettings
from gridd.state import GridState

__all__ = ["MergeGate", "MergeQueue", "PauseSeam", "queue_order"]

log = logging.getLogger(__name__)

#: Pause before trying a task again after a transient failure (a git lock, say).
RETRY_SECONDS = 2.0


def queue_order(tasks: list[Task]) -> list[Task]:
    """The merge queue (PURE): tasks in ``merging``, oldest approval first."""
    merging = [t for t in tasks if t.status == TaskStatus.MERGING]
    return sorted(merging, key=lambda t: (t.merge_queued_at or t.updated_at, t.id))


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
        self.timeout = settings.git_timeout_seconds
        self.slots = Slots(
            worktrees,
            integration_dir,
            count=settings.gate_concurrency,
            git_timeout=self.timeout,
        )
        self.integration = self.slots[0]
        self.landing = Landing(
            worktrees.root, own=(worktrees.dir, *self.slots.paths), git_timeout=self.timeout
        )
        self.policy = policy
        self.cleanup = Teardown(settings=settings, state=state, bus=bus, worktrees=worktrees)
        self.background = background
        self.pause = pause or PauseSeam()
        self.gate = MergeGate()
        self.outcomes = Outcomes(
            state=state,
            bus=bus,
            root=self.root,
            landing=self.landing,
            policy=policy,
            gate=self.gate,
            pause=self.pause,
            git_timeout=self.timeout,
        )
        self.batches = Batches(
            settings=settings,
            state=state,
            bus=bus,
            slots=self.slots,
            builder=Builder(
                settings=settings, outcomes=self.outcomes, policy=policy, gate=self.gate
            ),
            outcomes=self.outcomes,
            pause=self.pause,
        )
        self._wake = asyncio.Event()
        self.current: str | None = None  # the task being merged
        self._retry_at: dict[str, float] = {}
        self._teardowns: list[str] = []  # merged tasks whose worktree is yet to go
        state.on_change(self._wake.set)

    @property
    def train(self) -> MergeTrain | None:
        """The candidate under way, for ``/state`` (which tasks ride in it, and where it is)."""
        return self.batches.train

    def start(self) -> None:
        self.background.supervise("merge-queue", self.run)

    @property
    def capacity(self) -> int:
        """Tasks one train takes: up to ``max_batch`` per candidate, ``gate_concurrency``
        candidates at once; 1 without a check (no gate run to share: one at a time)."""
        if not self.settings.check:
            return 1
        return self.settings.max_batch * self.settings.gate_concurrency

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            for lock in await self.landing.sweep():
                log.warning("removed %s, left by a merge landing when its daemon died", lock)
            for slot in await self.slots.sweep():
                log.info("removed %s: past [merge] gate_concurrency", slot)
        except GriddError as exc:
            log.warning("looking for what an earlier merge left: %s", exc.message)
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
            wait = self._batch_wait(due)
            if wait > 0:  # approvals arriving together ride together
                await asyncio.sleep(wait)
                continue
            if len(due) > 1 and self.capacity > 1:
                await self._run_batch(due[: self.capacity])
                continue
            task = due[0]
            self.current = task.id
            try:
                await self.merge_one(task)
                self._retry_at.pop(task.id, None)
                self._teardowns.append(task.id)
            except GitTimeout as exc:  # a hanging filter or hook: retrying would hang again
                self._retry_at.pop(task.id, None)
                await self.outcomes.fail(task, exc)
            except Exception as exc:  # not CancelledError: a stopping daemon resumes it later
                message = exc.message if isinstance(exc, GriddError) else repr(exc)
                log.warning("merging task %s: %s; trying again shortly", task.id, message)
                self.bus.publish("task.merge_retry", {"taskId": task.id, "error": message[:2000]})
                self._retry_at[task.id] = loop.time() + RETRY_SECONDS
            finally:
                self.current = None
                self.state.flush()

    def _batch_wait(self, due: list[Task]) -> float:
        """How long to wait for more approvals before the train leaves (0: now)."""
        if self.capacity <= 1 or len(due) >= self.capacity:
            return 0.0
        oldest = due[0].merge_queued_at
        if oldest is None:
            return 0.0
        age = (utcnow() - oldest).total_seconds()
        return max(
            0.0, min(self.settings.batch_wait_seconds - age, self.settings.batch_wait_seconds)
        )

    async def _run_batch(self, batch: list[Task]) -> None:
        loop = asyncio.get_running_loop()
        self.current = batch[0].id
        try:
            await self.merge_batch(batch)
            for task in batch:
                self._retry_at.pop(task.id, None)
                self._teardowns.append(task.id)
        except Exception as exc:  # not CancelledError: a stopping daemon resumes it later
            message = exc.message if isinstance(exc, GriddError) else repr(exc)
            log.warning("merging tasks %s: %s; trying again shortly", ids_of(batch), message)
            for task in batch:
                self.bus.publish("task.merge_retry", {"taskId": task.id, "error": message[:2000]})
                self._retry_at[task.id] = loop.time() + RETRY_SECONDS
        finally:
            self.current = None
            self.batches.train = None
            self.state.flush()

    # -- one merge ---------------------------------------------------------------------------

    async def merge_one(self, task: Task) -> None:
        feature = self.state.session.feature_branch
        if feature is None or task.branch is None:
            async with self.gate.deciding(task.id):
                if self.outcomes.merging(task.id):  # nothing to merge into, or from
                    self.outcomes.done(task, commit=None, feature=feature)
            return
        ref = f"refs/heads/{feature}"
        if task.merge_commit and await self.outcomes.reachable(task.merge_commit, ref):
            # A daemon died after moving F and before recording it: only the record is missing.
            async with self.gate.deciding(task.id):
                if self.outcomes.merging(task.id):
                    self.outcomes.done(task, commit=task.merge_commit, feature=feature)
            return
        for _ in range(CAS_ROUNDS):
            tip = await branch_tip(self.root, feature, timeout=self.timeout)
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
                async with self.gate.deciding(task.id):
                    if self.outcomes.abandoned(task.id, feature):
                        return
                    await self.policy.conflict(task, files=result.files, feature_commit=tip)
                return
            marked = await self.policy.marker_files(
                task, cwd=self.integration.path, tip=tip, merged=result.commit, timeout=self.timeout
            )
            if marked:  # refused whatever the policy (git/integrity.py)
                async with self.gate.deciding(task.id):
                    if not self.outcomes.abandoned(task.id, feature):
                        self.policy.refuse_markers(task, files=marked, feature_commit=tip)
                return
            if self.settings.check:
                check = await self.integration.check(
                    self.settings.check, self.settings.check_timeout_seconds
                )
                if not check.ok:
                    async with self.gate.deciding(task.id):
                        if self.outcomes.abandoned(task.id, feature):
                            return
                        await self.policy.check_failed(
                            task, output=check.output, feature_commit=tip
                        )
                    return
            new = result.commit
            # merge and squash commit on top of tip; a rebase could end elsewhere (an
            # up-to-date branch): never move F to a commit that drops anything of it.
            rebased = self.settings.strategy == "rebase"
            if rebased and new != tip and not await self.outcomes.reachable(tip, new):
                raise GriddError(
                    f"the merge of {task.id} does not contain the feature branch's tip",
                    code="merge_not_descendant",
                )
            if self.outcomes.abandoned(task.id, feature):
                return
            task = self.state.update_task(task.id, merge_commit=new)  # recorded progress
            await self.pause.wait()
            if not await self.outcomes.land([(task, new)], feature=feature, tip=tip):
                return
            log.info("%s moved during the merge of %s; merging again", feature, task.id)
        raise GriddError(
            f"feature branch {feature!r} kept moving during the merge of {task.id}",
            code="feature_moving",
        )

    async def merge_batch(self, tasks: list[Task]) -> None:
        """Several tasks in one candidate, gated once; a failing one bisected (``batch.py``)."""
        feature = self.state.session.feature_branch
        if feature is None:
            for task in tasks:
                await self.merge_one(task)  # nothing to merge into
            return
        riding = []
        ref = f"refs/heads/{feature}"
        for task in tasks:
            if task.branch is None:
                await self.merge_one(task)  # nothing to merge
            elif task.merge_commit and await self.outcomes.reachable(task.merge_commit, ref):
                await self.merge_one(task)  # landed before a daemon died: only the record
            else:
                riding.append(task)
        if riding:
            await self.batches.run(riding, feature=feature)

    async def _teardown(self, task_id: str) -> None:
        task = self.state.tasks.get(task_id)
        feature = self.state.session.feature_branch
        if task is None or feature is None or task.status != TaskStatus.DONE:
            return
        try:
            # Its git (a status in the task's worktree runs the clean filters) is bounded too:
            # a filter that hangs must not stall the queue after a merge either.
            async with asyncio.timeout(self.timeout):
                await self.cleanup.run(task, feature)
        except GriddError as exc:  # the work is merged; a worktree left behind is harmless
            log.warning("tearing down %s: %s", task_id, exc.message)
        except TimeoutError:
            log.warning(
                "tearing down %s: git did not finish within %g s; its worktree is left",
                task_id,
                self.timeout,
            )
