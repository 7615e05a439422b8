"""Claiming beads: who holds which bead, claims made ahead of the slots, and the claims of
agents starting together sent to bd as one call.

A bead's task runs only once its claim (``bd update <id> --claim``) is won. Two things keep
bd off the path from a free slot to a running agent:

- **Claims ahead.** While the session runs, the next ``claim_ahead`` ready beads (in start
  order, first attempts only) are claimed before a slot is free for them, as worktrees are
  prepared ahead (``git/prepared.py``): when the slot frees, the start finds its bead
  already ours. A claim ahead that is lost cancels its task before it ever starts; one not
  used when the session stops is given back (open, unassigned).
- **One call for many.** ``bd update <id>... --claim --json`` claims each issue atomically
  (compare-and-set) and goes on past one it cannot claim: the issues it claimed are printed
  as a JSON array, each one it could not claim gets an ``Error claiming <id>: ...`` (or
  ``Error resolving <id>: ...``) line on stderr, and it exits 1 only when it claimed none.
  bd serialises its writers, so four claims in a row would cost four bd starts.

A claim of a bead waits for the writes to that bead still queued (``BeadWriter.drained``):
the writes to one bead stay in order, claims among them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from gridd.background import Background
from gridd.events import EventBus
from gridd.lifecycle import move_task
from gridd.model import Task, TaskStatus
from gridd.plan import start_order
from gridd.sources.bd import BdError, BdResult
from gridd.sources.bd_batch import UpdateBatcher, update_outcomes
from gridd.sources.beads_mirror import BeadWriter
from gridd.state import GridState

log = logging.getLogger(__name__)

#: How long the first claim waits for the others of the same scheduler pass.
GATHER_SECONDS = 0.005
#: After bd failed to answer a claim ahead, claims ahead pause this long (a start still
#: claims its own bead).
AHEAD_PAUSE_SECONDS = 5.0
RELEASE: list[str] = ["--status", "open", "--assignee", ""]


def claim_outcomes(ids: list[str], res: BdResult) -> dict[str, str | None]:
    """Per bead: None when bd claimed it, else why not. BdError when bd's answer says
    nothing about the beads (it failed before trying them)."""
    return update_outcomes(ids, res, verb="claimed")


def worth_claiming(
    tasks: Iterable[Task], *, source: str, held: Iterable[str], limit: int
) -> list[str]:
    """PURE. The beads to claim now: of the first ``limit`` ready first attempts of
    ``source`` in start order, those not already held (claimed or being claimed)."""
    if limit <= 0:
        return []
    taken = set(held)
    ready = sorted(
        (t for t in tasks if t.source == source and t.status == TaskStatus.READY),
        key=start_order,
    )
    upcoming = [t.id for t in ready if _first_run(t)][:limit]
    return [bead_id for bead_id in upcoming if bead_id not in taken]


def unused_claims(tasks: dict[str, Task], claimed: Iterable[str]) -> list[str]:
    """PURE. Claimed beads whose task never started (ready, first attempt, no branch):
    given back when the session stops."""
    unused = []
    for bead_id in claimed:
        task = tasks.get(bead_id)
        if task is not None and task.status == TaskStatus.READY and _first_run(task):
            unused.append(bead_id)
    return sorted(unused)


def _first_run(task: Task) -> bool:
    return task.attempts == 0 and task.branch is None


class ClaimBatcher:
    """Collects the claims made within GATHER_SECONDS and sends them to bd together."""

    def __init__(
        self, run: Callable[[list[str]], Awaitable[BdResult]], background: Background
    ) -> None:
        self._batches = UpdateBatcher(run, background, gather=GATHER_SECONDS, verb="claimed")

    async def claim(self, bead_id: str) -> str | None:
        """None when claimed, else bd's reason; BdError when bd could not answer."""
        return await self._batches.update(bead_id, ("--claim",))


class BeadClaims:
    """The beads this daemon holds, the claims under way, and the claims made ahead."""

    def __init__(
        self,
        *,
        source: str,
        run: Callable[[list[str]], Awaitable[BdResult]],
        writer: BeadWriter,
        state: GridState,
        bus: EventBus,
        background: Background,
        ahead: int,
    ) -> None:
        self.source = source
        self.writer = writer
        self.state = state
        self.bus = bus
        self.background = background
        self.ahead = ahead
        self.batcher = ClaimBatcher(run, background)
        #: Beads whose claim gridd holds (a cancelled task gives its bead back).
        self.held: set[str] = set()
        #: Claims under way: True when won, False when lost; BdError when bd did not answer.
        self._inflight: dict[str, asyncio.Task[bool | BdError]] = {}
        self._wake = asyncio.Event()
        self._paused_until = 0.0
        self.made_ahead = 0

    def start(self) -> None:
        if self.ahead > 0:
            self.state.on_change(self._wake.set)
            self.background.supervise("beads-claim-ahead", self._ahead_loop)

    async def claim(self, task: Task) -> bool:
        """Before the task's agent starts: True when the bead is ours, False when someone
        else holds it; BdError when bd could not answer."""
        if task.id in self.held:
            return True
        outcome = await asyncio.shield(self._claiming(task.id))
        if isinstance(outcome, BdError):
            raise outcome
        return outcome

    def _claiming(self, bead_id: str) -> asyncio.Task[bool | BdError]:
        claim = self._inflight.get(bead_id)
        if claim is None:
            claim = self.background.spawn(f"beads-claim:{bead_id}", self._claim(bead_id))
            self._inflight[bead_id] = claim
        return claim

    async def _claim(self, bead_id: str) -> bool | BdError:
        try:
            await self.writer.drained(bead_id)  # writes to one bead stay in order
            try:
                lost = await self.batcher.claim(bead_id)
            except BdError as exc:
                self.bus.publish("beads.error", {"error": str(exc), "taskId": bead_id})
                return exc
        finally:
            self._inflight.pop(bead_id, None)
        task = self.state.tasks.get(bead_id)
        if lost is not None:
            self.bus.publish("beads.claim_lost", {"taskId": bead_id, "message": lost[:300]})
            if task is not None and task.status == TaskStatus.READY:
                # Claimed ahead and never started (a start acts on a loss itself).
                move_task(
                    self.state,
                    bead_id,
                    TaskStatus.CANCELLED,
                    reason="claim lost",
                    error="claimed by someone else",
                )
                self.state.flush()
            return False
        self.held.add(bead_id)
        if task is None or task.status == TaskStatus.CANCELLED:
            self.release([bead_id])  # cancelled while the claim was under way
        elif not self.state.session.started and unused_claims(self.state.tasks, [bead_id]):
            self.release([bead_id])  # the session stopped while it was under way
        return True

    def release(self, bead_ids: Iterable[str]) -> None:
        """Give beads gridd holds but will not work on back: open and unassigned."""
        for bead_id in bead_ids:
            if bead_id in self.held:
                self.held.discard(bead_id)
                self.writer.submit(bead_id, [["update", bead_id, *RELEASE]])

    def session_stopped(self) -> None:
        self.release(unused_claims(self.state.tasks, self.held))

    # -- claims ahead ------------------------------------------------------------------------

    async def _ahead_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # the scheduler's pass first: its starts claim their own
            self.claim_ahead()

    def claim_ahead(self) -> list[str]:
        """Claim the next ready beads while the session runs; returns the ids sent."""
        if not self.state.session.started or time.monotonic() < self._paused_until:
            return []
        wanted = worth_claiming(
            self.state.tasks.values(),
            source=self.source,
            held=self.held | set(self._inflight),
            limit=self.ahead,
        )
        for bead_id in wanted:
            claim = self._claiming(bead_id)
            claim.add_done_callback(self._ahead_done)
        self.made_ahead += len(wanted)
        return wanted

    def _ahead_done(self, claim: asyncio.Task[bool | BdError]) -> None:
        if (
            not claim.cancelled()
            and claim.exception() is None
            and isinstance(claim.result(), BdError)
        ):
            self._paused_until = time.monotonic() + AHEAD_PAUSE_SECONDS
