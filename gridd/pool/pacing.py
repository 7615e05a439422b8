"""Output pacing: an agent's output is read no faster than the event stream's readers take it.

An agent writes to its run's ``output.log`` at the speed of a file; the daemon indexes it
and publishes ``agent.output`` events, which wait in the SSE streams' queues until sent. A
monitor that published as fast as it could read (1 MiB a look, then the next) filled those
queues with the whole flood: a 20 MiB burst held ~45 MB of chunks, their JSON and their SSE
encodings at once, although every byte is already safe on disk.

So between looks a monitor checks what the bus holds for its subscribers
(``EventBus.budget.held`` plus ``budget.pending``: bytes of queued events counted once, and of events published but not yet delivered). Above ``high`` it waits,
for as long as the readers make progress (the backlog goes down): the log on disk is the
buffer, and memory stays near ``high``. A backlog that does not move for ``patience`` is a
stalled reader's: the monitor stops waiting for it (the bus's own limits deal with a stalled
client, ``events.total_bytes``) until the backlog is back under ``high``. Pacing delays only
publishing, never the agent, and never loses or reorders a byte. The decision is the pure
``verdict``.

What a burst borrowed is handed back once it is over: when a monitor has nothing more to
read, at least ``TRIM_AFTER_BYTES`` were published since the last time, and the readers
have taken everything queued, the heap's free pages go back to the system
(``gridd.memory.trim``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from gridd import memory

#: Bytes of queued events above which monitors wait for readers to catch up.
HIGH_BYTES = 4 * 1024 * 1024
#: A backlog that has not gone down for this long belongs to a stalled reader.
PATIENCE_SECONDS = 0.5
#: How often a waiting monitor looks at the backlog again.
STEP_SECONDS = 0.005
#: Output published since the last trim that makes the next rest trim the heap...
TRIM_AFTER_BYTES = 4 * 1024 * 1024
#: ... once nothing is queued for the readers any more: looked at this often, this many times.
TRIM_RETRY_SECONDS = 0.25
TRIM_TRIES = 40


class Verdict(Enum):
    GO = "go"  # under the mark (or given up on a stalled reader): publish on
    WAIT = "wait"  # readers are catching up: look again shortly
    STALLED = "stalled"  # nothing moved for ``patience``: stop waiting until under the mark


def verdict(
    *,
    held: int,
    high: int,
    lowest: int,
    since: float,
    now: float,
    patience: float,
    taken: bool = False,
) -> Verdict:
    """Whether to publish more output (PURE). ``lowest``: the smallest backlog seen while
    waiting, first seen at ``since``; a new low is progress, and so is ``taken`` (readers
    took events since the last look, though others were published meanwhile: two
    publishers wait at once, the output pass and a finished run's monitor, and one's
    publishing must not make the other call a reader that keeps taking stalled)."""
    if held <= high:
        return Verdict.GO
    if held < lowest or taken:
        return Verdict.WAIT  # progress: the caller records it
    return Verdict.STALLED if now - since >= patience else Verdict.WAIT


@dataclass
class OutputPacer:
    """Shared by every monitor of a pool: ``held`` reads the bus's queued bytes."""

    held: Callable[[], int]
    #: Bytes the readers have taken, ever (``events.Budget.freed``); None: only new lows
    #: of ``held`` count as progress.
    taken: Callable[[], int] | None = None
    high: int = HIGH_BYTES
    patience: float = PATIENCE_SECONDS
    step: float = STEP_SECONDS
    stalled: bool = False
    waits: int = 0  # times a monitor waited (for tests and curiosity)
    unsettled: int = 0  # output bytes published since the heap was last trimmed
    trims: int = 0
    _trim_due: asyncio.Handle | None = field(default=None, repr=False)

    def published(self, nbytes: int) -> None:
        self.unsettled += nbytes

    def rest(self) -> None:
        """A monitor has read everything there was: after a burst, give memory back once
        the readers have taken it all (queued events hold the burst until then)."""
        if self.unsettled < TRIM_AFTER_BYTES or self._trim_due is not None:
            return
        self._trim_due = asyncio.get_running_loop().call_soon(self._trim, TRIM_TRIES)

    def _trim(self, tries: int) -> None:
        self._trim_due = None
        if self.held() > 0 and tries > 1:
            self._trim_due = asyncio.get_running_loop().call_later(
                TRIM_RETRY_SECONDS, self._trim, tries - 1
            )
            return
        self.unsettled = 0
        self.trims += 1
        memory.trim()

    async def settle(self) -> None:
        """Return once the readers have caught up (or are stalled). Costs nothing when the
        backlog is under the mark."""
        held = self.held()
        if held <= self.high:
            self.stalled = False
            return
        if self.stalled:
            return
        self.waits += 1
        lowest, since = held, time.monotonic()
        taken = self.taken() if self.taken is not None else 0
        while True:
            await asyncio.sleep(self.step)
            held, now = self.held(), time.monotonic()
            before, taken = taken, self.taken() if self.taken is not None else 0
            found = verdict(
                held=held,
                high=self.high,
                lowest=lowest,
                since=since,
                now=now,
                patience=self.patience,
                taken=taken > before,
            )
            if found is Verdict.GO:
                return
            if found is Verdict.STALLED:
                self.stalled = True
                return
            if held < lowest or taken > before:
                lowest, since = min(lowest, held), now
