"""The merge train's run: candidates built in the integration worktree, gated, landed.

Several waiting tasks are merged in order into one candidate, each with its own merge
commit (``_candidate``), the candidate is gated once (``[merge] check``), and it lands by
the queue's compare-and-swap under the gate of every riding task (``Outcomes.land``). A
failing candidate is bisected: which tasks to gate next, and whom to blame, is decided by
the pure ``train.py``; the task that fails alone goes to the policy, every other one lands.
"""

from __future__ import annotations

import logging
import secrets

from gridd.errors import GriddError
from gridd.events import EventBus
from gridd.git.integration import CheckResult, Conflicted, Integration
from gridd.git.on_conflict import OUTPUT_TAIL, ConflictPolicy
from gridd.git.outcomes import MergeGate, Outcomes, PauseSeam
from gridd.git.train import Bisection, Blame
from gridd.git.worktrees import GitTimeout, branch_tip
from gridd.model import MergeTrain, Task, utcnow
from gridd.settings import MergeSettings
from gridd.state import GridState

log = logging.getLogger(__name__)

#: Compare-and-swap rounds before giving up for now (the user keeps committing to F).
CAS_ROUNDS = 5


class Batches:
    def __init__(
        self,
        *,
        settings: MergeSettings,
        state: GridState,
        bus: EventBus,
        integration: Integration,
        outcomes: Outcomes,
        policy: ConflictPolicy,
        gate: MergeGate,
        pause: PauseSeam,
    ) -> None:
        self.settings = settings
        self.state = state
        self.bus = bus
        self.root = integration.root
        self.timeout = settings.git_timeout_seconds
        self.integration = integration
        self.outcomes = outcomes
        self.policy = policy
        self.gate = gate
        self.pause = pause
        #: The candidate under way, for ``/state`` (which tasks ride in it, and where it is).
        self.train: MergeTrain | None = None
        self.retries = 0  # last suspects that passed their gate alone: the gate was flaky

    async def run(self, riding: list[Task], *, feature: str) -> None:
        """Several tasks in one candidate, gated once; a failing one bisected (``train.py``)."""
        batch = f"{riding[0].id}-{secrets.token_hex(3)}"
        bisection = Bisection([t.id for t in riding])
        known: dict[tuple[str, str], str] = {}  # (task, the commit merged onto) -> its merge
        output = ""
        moved = 0
        while (step := bisection.next()) is not None:
            if isinstance(step, Blame):  # two failed runs held it, the others passed
                self._bisected(batch, bisection, culprit=step.task)
                await self.outcomes.blame(step.task, output=output, feature=feature)
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
                again = await self.outcomes.land(
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
                if any(self.outcomes.merging(t.id) for t, _ in rides):
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
                await self.outcomes.blame(culprit, output=output, feature=feature)

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
            task = self.outcomes.merging(task_id)
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
                await self.outcomes.fail(task, exc)
                continue
            if isinstance(result, Conflicted):
                if head != tip:
                    log.info("%s conflicts with a task ahead of it; merged later", task.id)
                    continue
                async with self.gate.deciding(task.id):
                    if not self.outcomes.abandoned(task.id, feature):
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
                    if not self.outcomes.abandoned(task.id, feature):
                        self.policy.refuse_markers(task, files=marked, feature_commit=tip)
                continue
            rebased = self.settings.strategy == "rebase"
            if (
                rebased
                and result.commit != head
                and not await self.outcomes.reachable(head, result.commit)
            ):
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
            if self.outcomes.merging(task.id) is not None:
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
