"""Mirroring task statuses onto beads: which ``bd`` writes a status change needs, and the
writer that runs them.

Stock bd knows only open, in_progress, blocked, deferred and closed (plus pinned and hooked,
plus the user's ``status.custom``), so gridd writes nothing else:

| gridd        | bd                                                                     |
| ------------ | ---------------------------------------------------------------------- |
| review       | in_progress + label ``review_label`` (or ``review_status`` if set)     |
| working      | after review: in_progress, label removed; after failed: claimed again  |
| done         | label removed, ``bd close --reason`` naming the merge commit           |
| failed       | open, unassigned, label ``failed_label``, and a comment saying why     |
| blocked      | blocked, and a comment saying why                                      |
| cancelled    | open and unassigned again, only when gridd holds the claim             |

Writes to one bead run in order; beads do not wait for each other. A write that fails is
retried with backoff in its own bead's lane only; a permanent refusal is reported once and
dropped, since the same call would be refused again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from gridd.background import Background
from gridd.events import EventBus
from gridd.model import TaskStatus
from gridd.settings import BeadsSettings
from gridd.sources.bd import BdError, BdResult, is_permanent
from gridd.sources.bd_batch import BdRefused, UpdateBatcher

log = logging.getLogger(__name__)

Write = list[str]
RunBd = Callable[[list[str]], Awaitable[BdResult]]
#: How long a write waits for the same change to other beads (it is off every critical
#: path: the agent has finished and its slot is free).
WRITE_GATHER_SECONDS = 0.05


def mirror_writes(
    bead_id: str,
    status: str,
    *,
    previous: str | None,
    settings: BeadsSettings,
    merge_commit: str | None = None,
    error: str | None = None,
    claimed: bool = False,
) -> list[Write]:
    """The bd calls that show ``status`` on the bead (``previous``: the last one shown)."""
    label = settings.review_label
    if status == TaskStatus.REVIEW:
        if settings.review_status:
            return [["update", bead_id, "--status", settings.review_status]]
        return [["update", bead_id, "--status", "in_progress", "--add-label", label]]
    if status == TaskStatus.WORKING:
        if previous in (TaskStatus.REVIEW, TaskStatus.MERGING):
            return [["update", bead_id, "--status", "in_progress", "--remove-label", label]]
        if previous in (TaskStatus.FAILED, TaskStatus.CANCELLED):
            return [["update", bead_id, "--claim", "--remove-label", settings.failed_label]]
        return []
    if status == TaskStatus.DONE:
        reason = f"gridd: merged as {merge_commit}" if merge_commit else "gridd: done"
        writes: list[Write] = []
        if not settings.review_status:
            writes.append(["update", bead_id, "--remove-label", label])
        return [*writes, ["close", bead_id, "--reason", reason]]
    if status == TaskStatus.FAILED:
        why = error or "no reason recorded"
        return [
            [
                "update",
                bead_id,
                "--status",
                "open",
                "--assignee",
                "",
                "--remove-label",
                label,
                "--add-label",
                settings.failed_label,
            ],
            ["comments", "add", bead_id, f"gridd: the task failed: {why}"[:4000]],
        ]
    if status == TaskStatus.BLOCKED:
        why = error or "it needs a human"
        return [
            ["update", bead_id, "--status", "blocked"],
            ["comments", "add", bead_id, f"gridd: the task is blocked: {why}"[:4000]],
        ]
    if status == TaskStatus.CANCELLED and claimed:
        return [["update", bead_id, "--status", "open", "--assignee", ""]]
    return []


def batchable(args: Write) -> bool:
    """An ``update`` of one bead that may share a call with the same update of others."""
    return (
        len(args) > 2
        and args[0] == "update"
        and not args[1].startswith("-")
        and "--json" not in args
    )


def retry_delay(attempt: int, *, base: float, cap: float = 30.0) -> float:
    """Seconds before retry number ``attempt`` (1-based): doubling from ``base`` up to ``cap``."""
    return float(min(cap, base * 2 ** max(0, attempt - 1)))


class BeadWriter:
    """One lane per bead: ordered writes within a bead, concurrency across beads."""

    def __init__(
        self, *, run: RunBd, bus: EventBus, background: Background, settings: BeadsSettings
    ) -> None:
        self._run = run
        self.bus = bus
        self.background = background
        self.settings = settings
        self._lanes: dict[str, deque[Write]] = {}
        self._draining: dict[str, asyncio.Task[None]] = {}
        self.batches = UpdateBatcher(run, background, gather=WRITE_GATHER_SECONDS)

    def submit(self, bead_id: str, writes: list[Write]) -> None:
        if not writes:
            return
        lane = self._lanes.get(bead_id)
        if lane is not None:
            lane.extend(writes)
            return
        self._lanes[bead_id] = deque(writes)
        self._draining[bead_id] = self.background.spawn(
            f"beads-write-{bead_id}", self._drain(bead_id)
        )

    async def drained(self, bead_id: str) -> None:
        """Return once no write to ``bead_id`` is queued or running."""
        while (drain := self._draining.get(bead_id)) is not None and not drain.done():
            await asyncio.wait([drain])

    async def _attempt(self, args: Write, *, batched: bool) -> str | None:
        """One try of a write: None when it landed, else what bd said."""
        if batched and batchable(args):
            why = await self.batches.update(args[1], tuple(args[2:]))
            return None if why is None else f"bd update {args[1]}: {why}"
        res = await self._run(args)
        if res.code == 0:
            return None
        return f"bd {' '.join(args[:2])} exited {res.code}: {res.message}"

    def pending(self, bead_id: str) -> int:
        lane = self._lanes.get(bead_id)
        return len(lane) if lane is not None else 0

    async def _drain(self, bead_id: str) -> None:
        lane = self._lanes[bead_id]
        try:
            while lane:
                await self._write(bead_id, lane[0])
                lane.popleft()
        finally:
            self._lanes.pop(bead_id, None)
            self._draining.pop(bead_id, None)

    async def _write(self, bead_id: str, args: Write) -> None:
        attempts = self.settings.write_attempts
        for attempt in range(1, attempts + 1):
            try:
                # A first try shares its bd call with the same change to other beads; a
                # retry goes alone, so a failing bead never holds another up.
                error = await self._attempt(args, batched=attempt == 1)
            except BdRefused as exc:
                error, permanent = str(exc), is_permanent(exc.reason)
            except BdError as exc:
                error, permanent = str(exc), False
            else:
                if error is None:
                    return
                permanent = is_permanent(error)
            last = permanent or attempt == attempts
            delay = 0.0 if last else retry_delay(attempt, base=self.settings.retry_seconds)
            self.bus.publish(
                "beads.error",
                {
                    "taskId": bead_id,
                    "command": args[0],
                    "error": error,
                    "attempt": attempt,
                    "permanent": permanent,
                    "retryInSeconds": None if last else delay,
                },
            )
            if last:
                log.warning("beads: giving up on bd %s for %s: %s", args[0], bead_id, error)
                return
            await asyncio.sleep(delay)
