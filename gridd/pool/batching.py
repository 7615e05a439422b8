"""The output pass: every run that wrote something since the last pass is read, and all of
their output is published in one store transaction.

With a few hundred agents each printing a line a second, what costs is not the line but the
work around it: a wake-up, a coroutine step, a transaction, the agent's row. So runs with new
data (``runs/wakeups.py``: a notification, the safety-net sweep, a new watch) are not
looked at one by one; they queue here (``wake``), and one background task (``run``) takes
the whole queue each time round:

1. each run is read (``RunWatch.poll``: output indexed, heartbeats, the adapter's signals);
2. every chunk read becomes an ``agent.output`` event, and every agent's published position
   moves, all in ONE transaction (``RunReader.publish_output``): a daemon killed at any
   point publishes exactly the rest on restart, as with one transaction per run;
3. then, run by run, what the looks mean besides output (``RunReader.apply_rest``).

A pass looks at each run once and stops taking runs after ``PASS_BYTES`` (a flood's 1 MiB
looks take turns with everyone else); a run that had more to give is queued again for the
next pass, and the pass waits for the event streams'
readers first (``OutputPacer``). A store that refuses the transaction (a full disk) keeps
every look (``RunWatch.hold``, nothing lost and nothing fed to an adapter twice) and the
runs are tried again with backoff, named in ``paused`` meanwhile (a ``/health`` warning, beside the monitor's own).

The monitor of each run (``monitoring.py``) no longer reads output; it wakes for exits, lost
shims and health deadlines, and reads what an exited run left itself (``finishing``).
"""

from __future__ import annotations

import asyncio
import logging

from gridd.errors import StoreError
from gridd.pool.context import PoolContext
from gridd.pool.pacing import OutputPacer
from gridd.pool.reading import RunReader
from gridd.runs.wakeups import Wakeup
from gridd.runs.watch import Poll, RunWatch

log = logging.getLogger(__name__)

#: A look at a run indexes at most this many chunks (``OutputLog.poll``); a full look
#: means more may be waiting, so the run is queued again at once.
MAX_CHUNKS_PER_LOOK = 16
#: A pass stops taking runs once it has read this much (the rest wait for the next one).
PASS_BYTES = 1024 * 1024
#: A run whose look could not be published: tried again after this (doubling, capped).
RETRY_SECONDS = 0.5
RETRY_MAX_SECONDS = 10.0


class OutputPass:
    def __init__(
        self,
        ctx: PoolContext,
        *,
        reader: RunReader,
        pacer: OutputPacer,
    ) -> None:
        self.ctx = ctx
        self.reader = reader
        self.pacer = pacer
        #: Agent ids whose runs have new data, in the order they were reported.
        self.due: dict[str, None] = {}
        #: Each watched agent's wake-up (its counts say how often its run was read).
        self.wakes: dict[str, Wakeup] = {}
        #: Agent id -> why reading its run is paused (its own: the monitor's are apart;
        #: /health shows both, ``watching.Pauses``).
        self.paused: dict[str, str] = {}
        self.passes = 0
        self.transactions = 0
        self._retry_in: dict[str, float] = {}
        self._retries: dict[str, asyncio.TimerHandle] = {}
        self._wanted = asyncio.Event()

    def wake(self, agent_id: str) -> None:
        """Queue a run for the next pass (``Wakeups.on_data``)."""
        if agent_id not in self._retries:  # a paused run waits for its retry
            self.due[agent_id] = None
            self._wanted.set()

    async def run(self) -> None:
        """The pass loop (a background task of the pool)."""
        try:
            while True:
                await self._wanted.wait()
                self._wanted.clear()
                published, more = self.run_pass()
                if published:
                    self.pacer.published(published)
                    await self.pacer.settle()  # the streams' readers catch up first
                if more:
                    self._wanted.set()
                    await asyncio.sleep(0)  # let the rest of the daemon run in between
                else:
                    self.pacer.rest()
        finally:
            for handle in self._retries.values():
                handle.cancel()
            self._retries.clear()

    def run_pass(self) -> tuple[int, bool]:
        """Read and publish every queued run (up to ``PASS_BYTES``). Returns the output
        bytes published and whether runs are still queued."""
        self.passes += 1
        runs = self.ctx.roster.runs
        looked: list[tuple[str, RunWatch, Poll]] = []
        again: list[str] = []  # runs whose look was full: queued after this pass
        read = 0
        while self.due and read < PASS_BYTES:
            agent_id = next(iter(self.due))
            del self.due[agent_id]
            run = runs.get(agent_id)
            if run is None or run.finishing or agent_id not in self.ctx.state.agents:
                continue  # gone, or its monitor reads what is left of it
            lifeless = run.last_life is None
            wake = self.wakes.get(agent_id)
            beats = True
            if wake is not None:  # only a notice of output.log alone spares the heartbeats
                beats, wake.beats_due = wake.beats_due, False
            try:
                polled = run.poll(beats=beats)
            except Exception as exc:  # e.g. an unreadable run file: this run waits, not all
                if wake is not None:
                    wake.beats_due = wake.beats_due or beats  # the retry looks again
                log.exception("agent %s: reading its run failed", agent_id)
                self._pause(agent_id, f"reading its run failed: {type(exc).__name__}: {exc}")
                continue
            if wake is not None:
                wake.counts.reads += 1
                wake.counts.wakeups += 1
                # The monitor sleeps until its health verdict could change. Life only
                # moves that later, except the first life (launch grace -> stall clock)
                # and life after a stall (the stall_kill deadline -> a new stall clock).
                if polled.life and (lifeless or self.ctx.state.agents[agent_id].stalled):
                    wake.set()
            looked.append((agent_id, run, polled))
            size = sum(len(c.text) for c in polled.chunks)
            read += size
            if len(polled.chunks) >= MAX_CHUNKS_PER_LOOK:
                # More may be waiting: in the next pass, after everyone else. One look per
                # run per pass, so a pass holds at most PASS_BYTES and one look's worth.
                again.append(agent_id)
        for agent_id in again:
            self.due[agent_id] = None
        if any(polled.chunks for _, _, polled in looked):
            try:
                self.transactions += 1
                with self.ctx.state.store.transaction():
                    self.reader.publish_output([(a, p) for a, _, p in looked])
            except Exception as exc:  # a full disk, or a bug: nothing read is dropped
                why = exc.message if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
                for agent_id, run, polled in looked:
                    run.hold(polled)
                    self._pause(agent_id, why)
                if isinstance(exc, StoreError):
                    log.error("publishing agent output: %s; trying again", why)
                else:
                    log.exception("publishing agent output failed; trying again")
                return 0, bool(self.due)
        for agent_id, run, polled in looked:
            self._settled(agent_id)
            try:
                self.reader.apply_rest(agent_id, run, polled)
            except Exception as exc:
                log.exception("agent %s: reading its run failed", agent_id)
                self._pause(agent_id, f"{type(exc).__name__}: {exc}")
        return read, bool(self.due)

    # -- paused runs -------------------------------------------------------------------------

    def _pause(self, agent_id: str, why: str) -> None:
        """Try the run again later (doubling up to ``RETRY_MAX_SECONDS``); /health says so."""
        self.due.pop(agent_id, None)
        self.paused[agent_id] = why
        delay = self._retry_in.get(agent_id, RETRY_SECONDS)
        self._retry_in[agent_id] = min(delay * 2, RETRY_MAX_SECONDS)
        old = self._retries.pop(agent_id, None)
        if old is not None:
            old.cancel()
        self._retries[agent_id] = asyncio.get_running_loop().call_later(
            delay, self._retry, agent_id
        )

    def _retry(self, agent_id: str) -> None:
        self._retries.pop(agent_id, None)
        self.wake(agent_id)

    def _settled(self, agent_id: str) -> None:
        if agent_id in self.paused:
            self.paused.pop(agent_id, None)
            self._retry_in.pop(agent_id, None)

    def forget(self, agent_id: str) -> None:
        """The run is over: nothing more to read or retry for it."""
        self.due.pop(agent_id, None)
        self.wakes.pop(agent_id, None)
        self._retry_in.pop(agent_id, None)
        self.paused.pop(agent_id, None)
        handle = self._retries.pop(agent_id, None)
        if handle is not None:
            handle.cancel()
