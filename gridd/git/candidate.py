"""A merge train's candidate: tasks merged in order, each with its own merge commit, on
the feature branch's tip or on the candidate ahead, in an integration worktree.

A task that conflicts with F's tip goes to the policy; one that conflicts only with a task
ahead of it (in this candidate or one ahead) stays queued, merged again once those landed
(it then conflicts with F itself, or not); one that would add conflict markers is refused,
per task, before any gate runs.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime

from gridd.errors import GriddError
from gridd.git.integration import CheckResult, Conflicted, Integration
from gridd.git.on_conflict import ConflictPolicy
from gridd.git.outcomes import MergeGate, Outcomes
from gridd.git.worktrees import GitTimeout
from gridd.model import Task
from gridd.settings import MergeSettings

log = logging.getLogger(__name__)


@dataclass
class Candidate:
    """``rides`` (each task with its merge commit) built in ``slot`` on ``ahead``, the
    candidate ahead's commit (None: on F's tip), and its gate run."""

    position: int  # 1: on F's tip
    slot: Integration
    rides: list[tuple[Task, str]]
    ahead: str | None
    gate: asyncio.Task[CheckResult] | None = None  # None: no check configured
    started_at: datetime | None = None
    phase: str = "gating"

    @property
    def ids(self) -> list[str]:
        return [t.id for t, _ in self.rides]

    @property
    def commit(self) -> str:
        return self.rides[-1][1]

    @property
    def failed(self) -> bool:
        """Its gate has failed (known before its verdict is taken)."""
        gate = self.gate
        if gate is None or not gate.done() or gate.cancelled() or gate.exception() is not None:
            return False
        return not gate.result().ok

    async def verdict(self) -> CheckResult | None:
        return None if self.gate is None else await self.gate


class Builder:
    def __init__(
        self,
        *,
        settings: MergeSettings,
        outcomes: Outcomes,
        policy: ConflictPolicy,
        gate: MergeGate,
    ) -> None:
        self.settings = settings
        self.outcomes = outcomes
        self.policy = policy
        self.gate = gate
        self.timeout = settings.git_timeout_seconds

    async def build(
        self,
        slot: Integration,
        task_ids: list[str],
        *,
        tip: str,
        head: str,
        feature: str,
        known: dict[tuple[str, str], str],
    ) -> list[tuple[Task, str]]:
        """Merge the tasks in order onto ``head`` (F's ``tip``, or the candidate ahead) in
        ``slot``, left at the last one: each riding task with its own merge commit.

        ``known``: merges made earlier in this train, by task and the commit merged onto.
        A bisection's prefixes are prefixes of the candidate that failed, on the same tip,
        and the rest sit on them once they landed: their merges (checked already) are
        reused, so a bisection round costs gate runs and no merging."""
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
                result = await slot.merge(
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
                task, cwd=slot.path, tip=head, merged=result.commit, timeout=self.timeout
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
        if rides:  # the last task was refused or conflicted, or the merges reused
            await slot.ready_at(head)
        return rides
