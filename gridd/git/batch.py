"""The merge train's run: candidates built, gated side by side, landed in order.

Several waiting tasks ride as a chain of candidates (``train.py`` decides which): each is
built in its own integration worktree (``slots.py``) on the candidate ahead of it, the
first on the feature branch's tip, every task with its own merge commit
(``candidate.py``), and its gate (``[merge] check``) starts as soon as it is built, so up
to ``[merge] gate_concurrency`` gates run at once (Zuul's dependent pipeline). Their
verdicts are taken in order:

- a candidate that passed lands, every one ahead of it having landed already, by the
  queue's compare-and-swap from the candidate ahead (``Outcomes.land``);
- a candidate that failed, every one ahead of it having passed, holds the trouble in its
  own tasks: the candidates behind it are discarded at once (their gates stopped; they
  hold its tasks) and are built again later without it, and its tasks are bisected, the
  task that fails alone going to the policy. Those ahead of it are never gated again.

Nothing moves the feature branch but the landing, in order: a daemon killed anywhere in
this leaves the candidates behind as scratch, and the queue builds them again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from typing import Literal

from gridd.errors import GriddError
from gridd.events import EventBus
from gridd.git.candidate import Builder, Candidate
from gridd.git.integration import CheckResult, Integration
from gridd.git.on_conflict import OUTPUT_TAIL
from gridd.git.outcomes import Outcomes, PauseSeam
from gridd.git.slots import Slots
from gridd.git.train import Bisection, Blame, Gate
from gridd.git.worktrees import branch_tip
from gridd.model import MergeTrain, Task, TrainCandidate, utcnow
from gridd.settings import MergeSettings
from gridd.state import GridState

log = logging.getLogger(__name__)

#: Compare-and-swap rounds before giving up for now (the user keeps committing to F).
CAS_ROUNDS = 5


@dataclass
class _Run:
    """One train: its tasks' bisection, and what the rounds so far learnt."""

    batch: str
    feature: str
    bisection: Bisection
    known: dict[tuple[str, str], str] = field(default_factory=dict)  # see candidate.py
    output: str = ""  # the last failed gate's
    moved: int = 0  # landings refused because F moved


class Batches:
    def __init__(
        self,
        *,
        settings: MergeSettings,
        state: GridState,
        bus: EventBus,
        slots: Slots,
        builder: Builder,
        outcomes: Outcomes,
        pause: PauseSeam,
    ) -> None:
        self.settings = settings
        self.state = state
        self.bus = bus
        self.slots = slots
        self.root = slots[0].root
        self.timeout = settings.git_timeout_seconds
        self.builder = builder
        self.outcomes = outcomes
        self.pause = pause
        #: The candidates under way, for ``/state`` (which tasks ride, and where they are).
        self.train: MergeTrain | None = None
        self.retries = 0  # last suspects that passed their gate alone: the gate was flaky

    async def run(self, riding: list[Task], *, feature: str) -> None:
        """The tasks as a chain of candidates gated at once; a failing one bisected."""
        run = _Run(
            batch=f"{riding[0].id}-{secrets.token_hex(3)}",
            feature=feature,
            bisection=Bisection([t.id for t in riding], slots=len(self.slots)),
        )
        while (step := run.bisection.next()) is not None:
            if isinstance(step, Blame):  # two failed runs held it, the others passed
                self._bisected(run, culprit=step.task)
                await self.outcomes.blame(step.task, output=run.output, feature=feature)
                run.bisection.blamed()
                break
            self.train = MergeTrain(
                batch_id=run.batch,
                phase="merging",
                tasks=step.tasks,
                bisecting=run.bisection.failing,
                retry=step.retry,
                retries=self.retries,
            )
            chain: list[Candidate] = []
            try:
                go_on = await self._round(run, step, chain)
            finally:  # a gate still running is stopped, and waited for
                await self._stop_gates(chain)
            if not go_on:
                return

    async def _round(self, run: _Run, step: Gate, chain: list[Candidate]) -> bool:
        """Build the step's candidates, gating each once built; take their verdicts in
        order. False: the train is through (the queue starts over with what is left)."""
        tip = await branch_tip(self.root, run.feature, timeout=self.timeout)
        if tip is None:
            raise GriddError(f"feature branch {run.feature!r} is gone", code="feature_missing")
        ridden: list[str] = []
        for index, part in enumerate(step.parts):
            if any(c.failed for c in chain):  # the rest would hold a failing candidate
                ridden += [task for later in step.parts[index:] for task in later]
                break
            ahead = chain[-1].commit if chain else None
            rides = await self.builder.build(
                self.slots[len(chain)],
                part,
                tip=tip,
                head=ahead or tip,
                feature=run.feature,
                known=run.known,
            )
            ridden += [t.id for t, _ in rides]
            if not rides:
                continue  # every one of the part left (conflicts, markers, cancels)
            candidate = Candidate(
                position=len(chain) + 1, slot=self.slots[len(chain)], rides=rides, ahead=ahead
            )
            chain.append(candidate)
            self._start(run, step, candidate, chain, tip=tip)
        if ridden != step.tasks:
            if run.bisection.failing or not ridden:
                self._discard(run, chain, reason="left")
                return False  # the evidence was about others: the queue starts over
            run.bisection.restart(ridden)
        for index, candidate in enumerate(chain):
            check = await candidate.verdict()
            if check is not None and not check.ok:
                self._failed(run, candidate, check)
                self._discard(run, chain[index + 1 :], reason="ahead_failed")
                culprit = run.bisection.failed(candidate.ids)
                self._bisected(run, culprit=culprit)
                if culprit is not None:
                    await self.outcomes.blame(culprit, output=run.output, feature=run.feature)
                return True
            landed = await self._land(run, step, candidate, chain, tip=tip)
            if landed == "landed":
                continue
            self._discard(run, chain[index + 1 :], reason=landed)
            if landed == "abandoned":
                return False  # a cancel: the queue merges the rest again
            run.moved += 1
            if run.moved >= CAS_ROUNDS:
                raise GriddError(
                    f"feature branch {run.feature!r} kept moving during a merge train",
                    code="feature_moving",
                )
            # Built again on F's new tip; a bisection's evidence was about the old one.
            return not run.bisection.failing
        return True

    def _start(
        self,
        run: _Run,
        step: Gate,
        candidate: Candidate,
        chain: list[Candidate],
        *,
        tip: str,
    ) -> None:
        """The candidate's gate, started now, beside those of the candidates ahead."""
        candidate.started_at = utcnow()
        if self.settings.check:
            name = f"merge-gate-{run.batch}-{candidate.position}"
            # Awaited by this round, in order, or stopped and awaited when it ends.
            candidate.gate = asyncio.create_task(self._gate(candidate.slot), name=name)
            # A failure discards the candidates behind at once: they hold its tasks.
            candidate.gate.add_done_callback(lambda _: self._stop_behind(candidate, chain))
        self._show(run, chain, tip=tip)
        self.bus.publish(
            "merge.batch_started",
            {
                "batchId": run.batch,
                "featureBranch": run.feature,
                "featureCommit": tip,
                "candidate": candidate.commit,
                "tasks": candidate.ids,
                "retry": step.retry,
                "bisecting": run.bisection.failing,
                "position": candidate.position,
                "ahead": candidate.ahead,
            },
        )

    async def _gate(self, slot: Integration) -> CheckResult:
        return await slot.check(self.settings.check, self.settings.check_timeout_seconds)

    def _stop_behind(self, failed: Candidate, chain: list[Candidate]) -> None:
        if failed.failed:
            for behind in chain[failed.position :]:
                if behind.gate is not None:
                    behind.gate.cancel()

    async def _stop_gates(self, chain: list[Candidate]) -> None:
        gates = [c.gate for c in chain if c.gate is not None]
        for gate in gates:
            gate.cancel()
        await asyncio.gather(*gates, return_exceptions=True)

    async def _land(
        self, run: _Run, step: Gate, candidate: Candidate, chain: list[Candidate], *, tip: str
    ) -> Literal["landed", "feature_moved", "abandoned"]:
        """The candidate passed, every one ahead of it landed: it lands now, unless F moved
        or one of its tasks was cancelled (then nobody of it lands)."""
        candidate.phase = "landing"
        self.bus.publish(
            "merge.batch_passed",
            {
                "batchId": run.batch,
                "tasks": candidate.ids,
                "candidate": candidate.commit,
                "retried": step.retry,
            },
        )
        if step.retry:
            self.retries += 1
        self._show(run, chain, tip=tip)
        for task, commit in candidate.rides:  # recorded progress
            self.state.update_task(task.id, merge_commit=commit)
        await self.pause.wait()
        rides = [(self.state.tasks.get(t.id, t), c) for t, c in candidate.rides]
        again = await self.outcomes.land(rides, feature=run.feature, tip=candidate.ahead or tip)
        self._clear_merge_commits(candidate.rides)
        if again:  # the user committed to F: merged again on top of their work
            return "feature_moved"
        if any(self.outcomes.merging(t) for t in candidate.ids):
            return "abandoned"
        candidate.phase = "landed"
        run.bisection.passed(candidate.ids)
        return "landed"

    def _failed(self, run: _Run, candidate: Candidate, check: CheckResult) -> None:
        candidate.phase = "failed"
        run.output = check.output
        self.bus.publish(
            "merge.batch_failed",
            {
                "batchId": run.batch,
                "tasks": candidate.ids,
                "candidate": candidate.commit,
                "exitCode": check.exit_code,
                "output": run.output[-OUTPUT_TAIL:],
            },
        )

    def _discard(
        self, run: _Run, behind: list[Candidate], *, reason: str, quiet: bool = False
    ) -> None:
        """Candidates that will not land as built: their gates stopped, and said so."""
        for candidate in behind:
            if candidate.phase in ("landed", "failed", "discarded"):
                continue
            if candidate.gate is not None:
                candidate.gate.cancel()
            candidate.phase = "discarded"
            if quiet:
                continue
            self.bus.publish(
                "merge.batch_discarded",
                {
                    "batchId": run.batch,
                    "tasks": candidate.ids,
                    "candidate": candidate.commit,
                    "position": candidate.position,
                    "reason": reason,
                },
            )

    def _bisected(self, run: _Run, *, culprit: str | None) -> None:
        self.bus.publish(
            "merge.bisected",
            {
                "batchId": run.batch,
                "suspects": [] if culprit else run.bisection.suspects,
                "putBack": run.bisection.put_back,
                "culprit": culprit,
            },
        )

    def _clear_merge_commits(self, rides: list[tuple[Task, str]]) -> None:
        """A candidate that did not land leaves no recorded progress on tasks still queued."""
        for task, _ in rides:
            if self.outcomes.merging(task.id) is not None:
                self.state.update_task(task.id, merge_commit=None)

    def _show(self, run: _Run, chain: list[Candidate], *, tip: str) -> None:
        if self.train is None or not chain:
            return
        live = [c for c in chain if c.phase not in ("landed", "discarded")] or chain[-1:]
        phase = "landing" if any(c.phase == "landing" for c in live) else "gating"
        started = [c.started_at for c in live if c.started_at is not None]
        self.train = self.train.model_copy(
            update={
                "phase": phase,
                "tasks": [t for c in live for t in c.ids],
                "feature_commit": live[0].ahead or tip,
                "candidate": live[-1].commit,
                "gate_started_at": min(started) if started else None,
                "retries": self.retries,
                "candidates": [
                    TrainCandidate(
                        position=c.position,
                        tasks=c.ids,
                        candidate=c.commit,
                        ahead=c.ahead,
                        phase=c.phase,
                        gate_started_at=c.started_at,
                    )
                    for c in live
                ],
            }
        )
