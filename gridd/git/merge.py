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

A merging task's fate is decided in one place at a time (``MergeGate``): the queue holds
the gate from its last look at the task's status to the status it sets (landed: ``done``;
conflict: the policy's), and cancel, stop and reject wait for it. So a cancel either wins
before the ref moves (the queue then sees a cancelled task and abandons the merge,
``task.merge_abandoned``) or finds the task ``done`` and says so; never both.

Every git call of the queue has a timeout (``[merge] git_timeout_seconds``): a filter or
hook that hangs is stopped with its process group, the task fails with the reason
(``task.merge_failed``) and the queue goes on to the next one.

The merge train (``[merge] max_batch`` > 1): several waiting tasks merged in order into one
candidate, each with its own merge commit, gated once, landed by the same compare-and-swap
under the gate of every riding task; a failing candidate is bisected (the decision is
``train.py``), the task that fails alone goes to the policy, every other one lands.

A daemon killed anywhere in this leaves nothing half-applied: before the swap, F is
untouched and the merge is simply redone; after it, the recorded ``merge_commit`` is
reachable from F and the task is marked done on resume. A conflict or a failed check is
handed to the session's ``on_conflict`` policy (``on_conflict.py``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from gridd.background import Background
from gridd.errors import GriddError
from gridd.events import EventBus
from gridd.git.integration import CheckResult, Conflicted, Integration
from gridd.git.landing import Held, Landing, Moved
from gridd.git.on_conflict import OUTPUT_TAIL, ConflictPolicy
from gridd.git.teardown import Teardown
from gridd.git.train import Bisection, Blame
from gridd.git.worktrees import GitTimeout, Worktrees, branch_tip, git
from gridd.lifecycle import move_task
from gridd.model import MergeTrain, Task, TaskStatus, utcnow
from gridd.settings import MergeSettings
from gridd.state import GridState

log = logging.getLogger(__name__)

#: Compare-and-swap rounds before giving up for now (the user keeps committing to F).
CAS_ROUNDS = 5
#: Pause before trying a task again after a transient failure (a git lock, say).
RETRY_SECONDS = 2.0
#: Pause between two tries to land a merge while F is checked out (or a git runs there).
LAND_RETRY_SECONDS = 0.1


def _ids(tasks: Iterable[Task]) -> str:
    return ", ".join(t.id for t in tasks)


def queue_order(tasks: list[Task]) -> list[Task]:
    """The merge queue (PURE): tasks in ``merging``, oldest approval first."""
    merging = [t for t in tasks if t.status == TaskStatus.MERGING]
    return sorted(merging, key=lambda t: (t.merge_queued_at or t.updated_at, t.id))


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
        self.integration = Integration(worktrees, integration_dir, git_timeout=self.timeout)
        self.landing = Landing(
            worktrees.root, own=(worktrees.dir, integration_dir), git_timeout=self.timeout
        )
        self.policy = policy
        self.cleanup = Teardown(settings=settings, state=state, bus=bus, worktrees=worktrees)
        self.background = background
        self.pause = pause or PauseSeam()
        self.gate = MergeGate()
        self._wake = asyncio.Event()
        self.current: str | None = None  # the task being merged
        self._retry_at: dict[str, float] = {}
        self._teardowns: list[str] = []  # merged tasks whose worktree is yet to go
        #: The candidate under way, for ``/state`` (which tasks ride in it, and where it is).
        self.train: MergeTrain | None = None
        self.retries = 0  # last suspects that passed their gate alone: the gate was flaky
        state.on_change(self._wake.set)

    def start(self) -> None:
        self.background.supervise("merge-queue", self.run)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            for lock in await self.landing.sweep():
                log.warning("removed %s, left by a merge landing when its daemon died", lock)
        except GriddError as exc:
            log.warning("looking for locks left by an earlier landing: %s", exc.message)
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
            if len(due) > 1 and self.settings.max_batch > 1:
                await self._run_batch(due[: self.settings.max_batch])
                continue
            task = due[0]
            self.current = task.id
            try:
                await self.merge_one(task)
                self._retry_at.pop(task.id, None)
                self._teardowns.append(task.id)
            except GitTimeout as exc:  # a hanging filter or hook: retrying would hang again
                self._retry_at.pop(task.id, None)
                await self._fail(task, exc)
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
        if self.settings.max_batch <= 1 or len(due) >= self.settings.max_batch:
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
            log.warning("merging tasks %s: %s; trying again shortly", _ids(batch), message)
            for task in batch:
                self.bus.publish("task.merge_retry", {"taskId": task.id, "error": message[:2000]})
                self._retry_at[task.id] = loop.time() + RETRY_SECONDS
        finally:
            self.current = None
            self.train = None
            self.state.flush()

    # -- one merge ---------------------------------------------------------------------------

    def _merging(self, task_id: str) -> Task | None:
        """The task, if it is still the queue's to merge (a cancel may have taken it)."""
        task = self.state.tasks.get(task_id)
        return task if task is not None and task.status == TaskStatus.MERGING else None

    async def merge_one(self, task: Task) -> None:
        feature = self.state.session.feature_branch
        if feature is None or task.branch is None:
            async with self.gate.deciding(task.id):
                if self._merging(task.id):  # nothing to merge into, or from
                    self._done(task, commit=None, feature=feature)
            return
        ref = f"refs/heads/{feature}"
        if task.merge_commit and await self._reachable(task.merge_commit, ref):
            # A daemon died after moving F and before recording it: only the record is missing.
            async with self.gate.deciding(task.id):
                if self._merging(task.id):
                    self._done(task, commit=task.merge_commit, feature=feature)
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
                    if self._abandoned(task.id, feature):
                        return
                    await self.policy.conflict(task, files=result.files, feature_commit=tip)
                return
            marked = await self.policy.marker_files(
                task, cwd=self.integration.path, tip=tip, merged=result.commit, timeout=self.timeout
            )
            if marked:  # refused whatever the policy (git/integrity.py)
                async with self.gate.deciding(task.id):
                    if not self._abandoned(task.id, feature):
                        self.policy.refuse_markers(task, files=marked, feature_commit=tip)
                return
            if self.settings.check:
                check = await self.integration.check(
                    self.settings.check, self.settings.check_timeout_seconds
                )
                if not check.ok:
                    async with self.gate.deciding(task.id):
                        if self._abandoned(task.id, feature):
                            return
                        await self.policy.check_failed(
                            task, output=check.output, feature_commit=tip
                        )
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
            if self._abandoned(task.id, feature):
                return
            task = self.state.update_task(task.id, merge_commit=new)  # recorded progress
            await self.pause.wait()
            if not await self._land([(task, new)], feature=feature, tip=tip):
                return
            log.info("%s moved during the merge of %s; merging again", feature, task.id)
        raise GriddError(
            f"feature branch {feature!r} kept moving during the merge of {task.id}",
            code="feature_moving",
        )

    async def _land(self, rides: list[tuple[Task, str]], *, feature: str, tip: str) -> bool:
        """Move F from ``tip`` to the last ride's commit and mark every riding task done
        (each with its own merge commit), waiting while F is checked out. False: finished
        here (landed, or abandoned: then nobody lands); True: F moved, merge again."""
        new = rides[-1][1]
        waiting_for: tuple[str, str] | None = None
        while True:
            async with AsyncExitStack() as held:
                for task, _ in rides:
                    await held.enter_async_context(self.gate.deciding(task.id))
                current = [(self._merging(task.id), commit) for task, commit in rides]
                gone = [
                    task.id
                    for (task, _), (now, commit) in zip(rides, current, strict=True)
                    if now is None or now.merge_commit != commit
                ]
                if gone:
                    for task_id in gone:
                        self._abandoned(task_id, feature)
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
                        self._done(now, commit=commit, feature=feature)
                    return False
            if waiting_for != (outcome.worktree, outcome.reason):
                waiting_for = (outcome.worktree, outcome.reason)
                log.info("the merge of %s waits: %s", _ids(t for t, _ in rides), outcome.message)
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
                    any(self._merging(task.id) is None for task, _ in rides)
                    or self.state.session.feature_branch != feature
                ):
                    break  # the next round says why (under the gate)
                await asyncio.sleep(LAND_RETRY_SECONDS)

    # -- the train ---------------------------------------------------------------------------

    async def merge_batch(self, tasks: list[Task]) -> None:
        """Several tasks in one candidate, gated once; a failing one bisected (``train.py``)."""
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
            elif task.merge_commit and await self._reachable(task.merge_commit, ref):
                await self.merge_one(task)  # landed before a daemon died: only the record
            else:
                riding.append(task)
        if not riding:
            return
        batch = f"{riding[0].id}-{secrets.token_hex(3)}"
        bisection = Bisection([t.id for t in riding])
        known: dict[tuple[str, str], str] = {}  # (task, the commit merged onto) -> its merge
        output = ""
        moved = 0
        while (step := bisection.next()) is not None:
            if isinstance(step, Blame):  # two failed runs held it, the others passed
                self._bisected(batch, bisection, culprit=step.task)
                await self._blame(step.task, output=output, feature=feature)
                bisection.blamed()
                break
            self.train = MergeTrain(
                batch_id=batch,
                phase="merging",
                tasks=step.tasks,
                bisecting=bisection.failing,
                retry=step.retry,
                retries=self.retries,
            )
            built = await self._candidate(step.tasks, feature=feature, known=known)
            if built is None:
                return  # every one left the batch (conflicts, markers, cancels)
            tip, rides = built
            ids = [t.id for t, _ in rides]
            if ids != step.tasks:
                if bisection.failing:
                    return  # the evidence was about others: the queue starts over
                bisection.restart(ids)
            self._train_view(rides, tip=tip, phase="gating")
            self.bus.publish(
                "merge.batch_started",
                {
                    "batchId": batch,
                    "featureBranch": feature,
                    "featureCommit": tip,
                    "candidate": rides[-1][1],
                    "tasks": ids,
                    "retry": step.retry,
                    "bisecting": bisection.failing,
                },
            )
            check = await self._gate()
            if check is None or check.ok:
                self.bus.publish(
                    "merge.batch_passed",
                    {
                        "batchId": batch,
                        "tasks": ids,
                        "candidate": rides[-1][1],
                        "retried": step.retry,
                    },
                )
                if step.retry:
                    self.retries += 1
                self._train_view(rides, tip=tip, phase="landing")
                for task, commit in rides:  # recorded progress
                    self.state.update_task(task.id, merge_commit=commit)
                await self.pause.wait()
                again = await self._land(
                    [(self.state.tasks.get(t.id, t), c) for t, c in rides], feature=feature, tip=tip
                )
                self._clear_merge_commits(rides)
                if again:  # the user committed to F: merged again on top of their work
                    moved += 1
                    if moved >= CAS_ROUNDS:
                        raise GriddError(
                            f"feature branch {feature!r} kept moving during a merge train",
                            code="feature_moving",
                        )
                    if bisection.failing:
                        return  # the tip the evidence was about is gone: start over
                    continue
                if any(self._merging(t.id) for t, _ in rides):
                    return  # abandoned (a cancel): the queue merges the rest again
                bisection.passed(ids)
                continue
            output = check.output
            self.bus.publish(
                "merge.batch_failed",
                {
                    "batchId": batch,
                    "tasks": ids,
                    "candidate": rides[-1][1],
                    "exitCode": check.exit_code,
                    "output": output[-OUTPUT_TAIL:],
                },
            )
            culprit = bisection.failed(ids)
            self._bisected(batch, bisection, culprit=culprit)
            if culprit is not None:
                await self._blame(culprit, output=output, feature=feature)

    async def _candidate(
        self, task_ids: list[str], *, feature: str, known: dict[tuple[str, str], str]
    ) -> tuple[str, list[tuple[Task, str]]] | None:
        """Merge the tasks in order onto F's tip in the integration worktree (left at the
        last one): the tip and each riding task with its own merge commit. A task that
        conflicts with F's tip goes to the policy; one that conflicts only with a task ahead
        of it in this candidate stays queued (merged again once those landed, it conflicts
        with F itself, or not); one that would add conflict markers is refused.

        ``known``: merges made earlier in this train, by task and the commit merged onto. A
        bisection's half is a prefix of the candidate that failed, on the same tip, and the
        rest sit on that prefix once it landed: their merges (checked already) are reused,
        so a bisection round costs a gate run and no merging."""
        tip = await branch_tip(self.root, feature, timeout=self.timeout)
        if tip is None:
            raise GriddError(f"feature branch {feature!r} is gone", code="feature_missing")
        head = tip
        rides: list[tuple[Task, str]] = []
        for task_id in task_ids:
            task = self._merging(task_id)
            if task is None or task.branch is None:
                continue
            key = (f"{task.id}@{task.merge_queued_at}", head)
            if (made := known.get(key)) is not None:
                rides.append((task, made))
                head = made
                continue
            try:
                result = await self.integration.merge(
                    tip=head,
                    branch=task.branch,
                    strategy=self.settings.strategy,
                    task_id=task.id,
                    title=task.title,
                )
            except GitTimeout as exc:  # this task's filter or hook: it fails, the rest ride
                await self._fail(task, exc)
                continue
            if isinstance(result, Conflicted):
                if head != tip:
                    log.info("%s conflicts with a task ahead of it; merged later", task.id)
                    continue
                async with self.gate.deciding(task.id):
                    if not self._abandoned(task.id, feature):
                        await self.policy.conflict(task, files=result.files, feature_commit=tip)
                continue
            marked = await self.policy.marker_files(
                task,
                cwd=self.integration.path,
                tip=head,
                merged=result.commit,
                timeout=self.timeout,
            )
            if marked:  # refused whatever the policy (git/integrity.py)
                async with self.gate.deciding(task.id):
                    if not self._abandoned(task.id, feature):
                        self.policy.refuse_markers(task, files=marked, feature_commit=tip)
                continue
            rebased = self.settings.strategy == "rebase"
            if rebased and result.commit != head and not await self._reachable(head, result.commit):
                raise GriddError(
                    f"the merge of {task.id} does not contain the candidate ahead of it",
                    code="merge_not_descendant",
                )
            known[key] = result.commit
            rides.append((task, result.commit))
            head = result.commit
        if not rides:
            return None
        if await self.integration.head() != head:
            await self.integration.reset(head)  # the last task was refused or conflicted
        return tip, rides

    async def _gate(self) -> CheckResult | None:
        if not self.settings.check:
            return None
        return await self.integration.check(
            self.settings.check, self.settings.check_timeout_seconds
        )

    async def _blame(self, task_id: str, *, output: str, feature: str) -> None:
        """The task fails the gate without the others: back through the policy."""
        tip = await branch_tip(self.root, feature, timeout=self.timeout) or ""
        async with self.gate.deciding(task_id):
            task = self.state.tasks.get(task_id)
            if task is None or self._abandoned(task_id, feature):
                return
            await self.policy.check_failed(task, output=output, feature_commit=tip)

    def _bisected(self, batch: str, bisection: Bisection, *, culprit: str | None) -> None:
        self.bus.publish(
            "merge.bisected",
            {
                "batchId": batch,
                "suspects": [] if culprit else bisection.suspects,
                "putBack": bisection.put_back,
                "culprit": culprit,
            },
        )

    def _clear_merge_commits(self, rides: list[tuple[Task, str]]) -> None:
        """A candidate that did not land leaves no recorded progress on tasks still queued."""
        for task, _ in rides:
            if self._merging(task.id) is not None:
                self.state.update_task(task.id, merge_commit=None)

    def _train_view(self, rides: list[tuple[Task, str]], *, tip: str, phase: str) -> None:
        if self.train is None:
            return
        self.train = self.train.model_copy(
            update={
                "phase": phase,
                "tasks": [t.id for t, _ in rides],
                "feature_commit": tip,
                "candidate": rides[-1][1],
                "gate_started_at": utcnow() if phase == "gating" else self.train.gate_started_at,
                "retries": self.retries,
            }
        )

    def _abandoned(self, task_id: str, feature: str) -> bool:
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

    async def _reachable(self, commit: str, ref: str) -> bool:
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

    def _done(self, task: Task, *, commit: str | None, feature: str | None) -> None:
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

    async def _fail(self, task: Task, exc: GitTimeout) -> None:
        """A merge stopped by its timeout: the task fails with the reason, F untouched."""
        log.warning("merging task %s: %s", task.id, exc.message)
        async with self.gate.deciding(task.id):
            if self._merging(task.id) is None:
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
