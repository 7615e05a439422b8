"""Monitoring agents: one monitor per agent, from its spawn (or reattachment) until it has
exited and been finished.

A monitor sleeps until something may have changed its agent's fate (``runs/wakeups.py``):
``exit.json`` arrived, the supervisor died, or a health deadline came. Only then does it
read ``exit.json``; it judges the agent's health (launch failure, stall; ``liveness.py``)
and, once the agent has exited, reads what its run left and calls ``on_exit`` (the
finisher, set by the composition root). A supervisor gone without an exit record is an
orphaned run: monitored while its agent lives, then failed with that reason.

Output is not the monitor's: runs with new data are read and published together by the
output pass (``batching.py``), many agents' lines in one store transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping

from gridd.errors import StoreError
from gridd.liveness import LAUNCH_HINT, Verdict, assess, next_change
from gridd.model import AgentStatus
from gridd.pool.batching import OutputPass
from gridd.pool.context import PoolContext
from gridd.pool.pacing import OutputPacer
from gridd.pool.reading import RunReader
from gridd.pool.stopping import Stopper
from gridd.pool.talking import Conversation
from gridd.runs.executor import AgentHandle, ExitStatus
from gridd.runs.wakeups import Wakeup, Wakeups
from gridd.runs.watch import RunWatch

log = logging.getLogger(__name__)

#: Where nothing reports the shim's death (no pidfd) the monitor asks the OS this often.
LIVENESS_SECONDS = 0.5
#: A state database that cannot be written: retry monitoring after this (doubling, capped).
STORE_RETRY_SECONDS = 0.5
STORE_RETRY_MAX_SECONDS = 10.0

#: Finishes an agent run (``finish.Finisher.finish``).
OnExit = Callable[[str, ExitStatus, RunWatch], Awaitable[None]]


class Pauses(MutableMapping[str, str]):
    """Agent id -> why its run is not being looked after, as ``/health`` shows it: the
    monitor's own reasons (``own``, what this mapping writes) together with those of the
    output pass (``others``, read only). Each owner clears only its own reasons: the output
    pass settling a run never hides a paused monitor, nor the other way round."""

    def __init__(self, *others: Mapping[str, str]) -> None:
        self.own: dict[str, str] = {}
        self.others = others

    def __getitem__(self, agent_id: str) -> str:
        reasons = [d[agent_id] for d in (self.own, *self.others) if agent_id in d]
        if not reasons:
            raise KeyError(agent_id)
        return "; ".join(reasons)

    def __setitem__(self, agent_id: str, why: str) -> None:
        self.own[agent_id] = why

    def __delitem__(self, agent_id: str) -> None:
        del self.own[agent_id]

    def pop(self, agent_id: str, *default: object) -> object:  # type: ignore[override]
        """Clears the monitor's own reason only."""
        return self.own.pop(agent_id, *default)

    def __iter__(self) -> Iterator[str]:
        seen = dict.fromkeys(self.own)
        for other in self.others:
            seen.update(dict.fromkeys(other))
        return iter(seen)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:  # read on every /health (``Grid.health_key``): no walk
        return bool(self.own) or any(self.others)


class Monitor:
    def __init__(
        self,
        ctx: PoolContext,
        *,
        reader: RunReader,
        stopper: Stopper,
        talk: Conversation,
        wakeups: Wakeups,
        on_exit: OnExit | None = None,
    ) -> None:
        self.ctx = ctx
        self.reader = reader
        self.stopper = stopper
        self.talk = talk
        #: What wakes the monitors: file notifications, the shims' exits, a safety-net sweep.
        self.wakeups = wakeups
        self._sweeping = False
        #: Finishes an agent run (``finish.Finisher.finish``, timed by the metrics).
        self.on_exit = on_exit
        self.pacer = OutputPacer(
            held=lambda: ctx.bus.budget.held + ctx.bus.budget.pending,
            taken=lambda: ctx.bus.budget.freed,
        )
        #: Reads and publishes the output of every run that wrote (one task for all).
        self.output = OutputPass(ctx, reader=reader, pacer=self.pacer)
        #: Agent id -> why monitoring it (or reading its output) is paused, retried with
        #: backoff; /health shows it. Each keeps its own reasons (``Pauses``).
        self.paused = Pauses(self.output.paused)
        wakeups.on_data = lambda wake: self.output.wake(wake.key)

    def spawn(self, agent_id: str) -> None:
        """Start monitoring an agent (a background task named ``agent:<id>``)."""
        self.ctx.background.spawn(f"agent:{agent_id}", self.monitor(agent_id))

    def _wakeup(self, agent_id: str, handle: AgentHandle, run: RunWatch) -> Wakeup:
        """The monitor's alarm clock (``runs/wakeups.py``); the sweep starts with the first."""
        if not self._sweeping:
            self._sweeping = True
            self.wakeups.start()
            self.ctx.background.supervise("agent-wakeups", self.wakeups.run, core=True)
            self.ctx.background.supervise("agent-output", self.output.run, core=True)
        wake = self.wakeups.watch(
            handle.run_dir,
            unread=run.unread_data,
            key=agent_id,
            shim_pid=handle.shim_pid if handle.shim_create_time is not None else None,
            shim_alive=handle.shim_alive,
        )
        self.output.wakes[agent_id] = wake
        return wake

    async def monitor(self, agent_id: str) -> None:
        """Monitor one agent until it has exited and been finished. A state database that
        cannot be written (a full or read-only disk) pauses the monitoring, never ends it:
        the agent's output stays in its run files and the monitoring resumes once writes work.
        Any other failure (a bug) is retried the same way: an agent is never left unmonitored.
        While paused, the agent is named in ``paused`` (a ``/health`` warning)."""
        pause = STORE_RETRY_SECONDS
        try:
            while agent_id in self.ctx.roster.handles:
                try:
                    await self._monitor_once(agent_id)
                    return
                except StoreError as exc:
                    why = exc.message
                    log.error("agent %s: %s; watching again in %.0fs", agent_id, why, pause)
                except Exception as exc:
                    why = f"{type(exc).__name__}: {exc}"
                    log.exception("agent %s: watching failed; again in %.0fs", agent_id, pause)
                self.paused[agent_id] = why
                await asyncio.sleep(pause)
                self.paused.pop(agent_id, None)
                pause = min(pause * 2, STORE_RETRY_MAX_SECONDS)
        finally:
            self.paused.pop(agent_id, None)
            self.output.forget(agent_id)

    async def _monitor_once(self, agent_id: str) -> None:
        handle, run = self.ctx.roster.handles[agent_id], self.ctx.roster.runs[agent_id]
        wake = self._wakeup(agent_id, handle, run)
        try:
            await self._monitor_run(agent_id, handle, run, wake)
        finally:
            self.wakeups.unwatch(wake)

    async def _monitor_run(
        self, agent_id: str, handle: AgentHandle, run: RunWatch, wake: Wakeup
    ) -> None:
        """Wake each time the agent's fate may have changed (see ``Wakeups``): its exit
        record arrived, the shim died, or a health deadline came."""
        next_liveness = 0.0
        while True:
            wake.clear()  # before looking: anything from here on wakes us again
            status = handle.exit_status() if wake.take_exit_due() else None
            now = time.monotonic()
            # Asking the OS whether the shim lives costs far more than reading a file:
            # exit.json is the normal way out and a pidfd reports the shim's death, so this
            # is only the safety net where no pidfd watches it (or the agent is orphaned).
            ask_os = wake.shim_gone or (not wake.shim_watched and now >= next_liveness)
            if status is None and ask_os and not handle.shim_alive():
                # The shim writes exit.json just before it exits: look once more.
                status = handle.exit_status() or self._orphaned(agent_id, handle, run)
            if status is None and now >= next_liveness:
                next_liveness = now + LIVENESS_SECONDS
            if status is not None:
                self.ctx.egress.close(agent_id)  # nothing of the run is left to use it
                await self._read_the_rest(agent_id, run, wake)
                self.wakeups.unwatch(wake)  # nothing more can happen to it
                if self.on_exit is not None:
                    await self.on_exit(agent_id, status, run)
                return
            self.check_health(agent_id, run)
            await wake.wait(self._sleep_for(agent_id, run, wake))

    async def _read_the_rest(self, agent_id: str, run: RunWatch, wake: Wakeup) -> None:
        """The agent has exited: read and publish everything its run still holds (the
        output pass leaves it alone from now on), the end of its output included."""
        run.finishing = True
        polled = run.poll(final=True)
        while True:
            wake.counts.reads += 1
            self.reader.apply(agent_id, run, polled)
            if polled.chunks:
                self.pacer.published(sum(len(c.text) for c in polled.chunks))
                await self.pacer.settle()
            polled = run.poll(final=True)
            if not polled.chunks and not polled.beats:
                break
        run.output.close()  # nothing more will be written: give its descriptors back
        self.pacer.rest()

    def _sleep_for(self, agent_id: str, run: RunWatch, wake: Wakeup) -> float | None:
        """How long a monitor may sleep when nothing wakes it: until its next health verdict,
        or the liveness check where nothing reports the shim's death."""
        agent = self.ctx.state.agents[agent_id]
        limits = self.ctx.limits(agent)
        started = self.ctx.started(agent_id)
        health_due = next_change(
            now=time.monotonic(), started=started, last_life=run.last_life, limits=limits
        )
        if agent.status not in (AgentStatus.RUNNING, AgentStatus.STARTING):
            # Stopping, or waiting for a human: silence is expected. Look now and then all
            # the same: an answer makes it running again, and its clock starts anew.
            health_due = self.wakeups.sweep_seconds
        liveness = None if wake.shim_watched and not run.orphaned else LIVENESS_SECONDS
        waits = [w for w in (health_due, liveness) if w is not None]
        return min(waits) if waits else None

    def _orphaned(self, agent_id: str, handle: AgentHandle, run: RunWatch) -> ExitStatus | None:
        """The shim is gone without a readable exit record. While the agent itself still
        runs (its output still reaches the log) it is monitored on; once it is gone too, its
        exit status is unknown and that is the reason it failed."""
        exit_file = handle.run_dir / "exit.json"
        if exit_file.exists():
            reason = f"{exit_file} is unreadable; the agent's exit status is unknown"
        else:
            reason = "the agent's supervisor died; its exit status is unknown"
        if handle.group_alive():
            if not run.orphaned:
                run.orphaned = True
                self.ctx.bus.publish(
                    "agent.warning",
                    {"agentId": agent_id, "warning": f"{reason}; watching it until it exits"},
                )
            return None
        return ExitStatus(None, None, reason)

    def check_health(self, agent_id: str, run: RunWatch) -> None:
        agent = self.ctx.state.agents[agent_id]
        if agent.status not in (AgentStatus.RUNNING, AgentStatus.STARTING):
            return  # stopping, or waiting for a human: silence is expected
        started = self.ctx.started(agent_id)
        limits = self.ctx.limits(agent)
        verdict = assess(
            now=time.monotonic(), started=started, last_life=run.last_life, limits=limits
        )
        if verdict is Verdict.LAUNCH_FAILED and not run.launch_failed:
            run.launch_failed = True
            reason = f"no output and no heartbeat within {limits.launch_grace:g}s"
            self.ctx.bus.publish(
                "agent.launch_failed",
                {
                    "agentId": agent_id,
                    "taskId": agent.task_id,
                    "reason": reason,
                    "hint": LAUNCH_HINT,
                },
            )
            self.stopper.request_stop(agent_id, reason, force=True)
        elif verdict is Verdict.STALLED and not agent.stalled:
            self.ctx.state.update_agent(agent_id, stalled=True)
            silent = time.monotonic() - (run.last_life or started)
            self.ctx.bus.publish(
                "agent.stalled",
                {"agentId": agent_id, "taskId": agent.task_id, "silentSeconds": round(silent, 1)},
            )
            nudge = run.adapter.stall_nudge()
            if nudge is not None and not run.nudged:
                self.talk.nudge(agent_id, run, nudge, why="a stall")
        elif verdict is Verdict.STALL_KILL:
            nudge = run.adapter.stall_nudge()
            if (
                nudge is not None
                and not run.nudged
                and self.talk.nudge(agent_id, run, nudge, why="a stall")
            ):
                run.last_life = time.monotonic()  # a stall kills only after the nudge failed
                return
            self.stopper.request_stop(agent_id, f"stalled: silent for over {limits.stall_kill:g}s")
