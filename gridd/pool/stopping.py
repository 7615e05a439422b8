"""Stopping agents: a requested stop (SIGTERM, SIGKILL after the grace period), a kill, and
the end of a conversation whose last turn is over (stdin closed, then TERM and KILL if the
agent lingers).

Signals go to the agent's whole process group through its handle (``runs/executor.py``);
a stop already in flight in this daemon is never started twice.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path

from gridd.errors import StoreError
from gridd.lifecycle import move_agent
from gridd.model import AgentStatus, utcnow
from gridd.pool.context import PoolContext
from gridd.runs.executor import AgentHandle
from gridd.runs.watch import RunWatch

log = logging.getLogger(__name__)


class Stopper:
    def __init__(self, ctx: PoolContext) -> None:
        self.ctx = ctx

    def request_stop(self, agent_id: str, reason: str, *, force: bool = False) -> None:
        """Ask an agent to stop: SIGTERM to its group, SIGKILL after the grace period."""
        ctx = self.ctx
        agent = ctx.state.agents.get(agent_id)
        if agent is None or agent.status == AgentStatus.EXITED:
            return
        if agent_id not in ctx.roster.handles:
            # Its spawn is still in flight, or it has exited and is being finished: nothing
            # to signal. What is wanted stays recorded; the next pass asks again. A spawn
            # in flight is given up if its run has not started (a pod still being
            # scheduled): it then settles as stopped (``pool/spawning.py``).
            if agent.status == AgentStatus.STARTING:
                ctx.executor.abandon_start(Path(agent.run_dir))
            return
        stops = ctx.roster.stops
        if agent_id in stops and (stops[agent_id] or not force):
            return  # already being stopped (or killed) by this daemon
        stops[agent_id] = force
        move_agent(ctx.state, agent_id, AgentStatus.STOPPING, reason=reason, stop_reason=reason)
        ctx.background.spawn(f"stop:{agent_id}", self._stop(agent_id, force=force))

    async def _stop(self, agent_id: str, *, force: bool) -> None:
        handle = self.ctx.roster.handles.get(agent_id)
        if handle is None:
            return
        await self._signal(agent_id, handle, signal.SIGKILL if force else signal.SIGTERM)
        if force:
            return
        grace = self.ctx.settings.scheduler.stop_grace_seconds
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            # Wait for the whole group: a child that outlives the agent is killed as well.
            if not handle.group_alive():
                return
            await asyncio.sleep(0.05)
        log.warning("agent %s ignored SIGTERM for %.0fs; killing", agent_id, grace)
        await self._signal(agent_id, handle, signal.SIGKILL)

    async def _signal(self, agent_id: str, handle: AgentHandle, sig: signal.Signals) -> None:
        """Signal the agent's group, noting (``signalledAt``, once) when the signal could be
        why the agent exits with a code of its own: it still ran and handles that signal
        itself. A signal it does not handle ends it by that signal, never with exit 0; so
        an exit 0 without ``signalledAt`` is the run's own completion, however close a stop
        came (``outcome.decide``). The handle's calls run off the loop: for a run in a box
        each is an exec (a ``podman exec``, a Kubernetes API call), and stopping a whole
        session signals every run."""
        state = self.ctx.state
        agent = state.agents.get(agent_id)
        noted = agent is not None and agent.signalled_at is not None

        def send() -> bool:
            first = not noted and handle.alive() and handle.handles_signal(sig)
            handle.signal(sig)
            return first

        if await asyncio.to_thread(send):
            try:
                state.update_agent(agent_id, signalled_at=utcnow())
            except StoreError:  # a full disk must not hold up the stop: remembered here
                state.update_agent(agent_id, persist=False, signalled_at=utcnow())

    # -- ending a conversation ------------------------------------------------------------------

    def end_conversation(self, agent_id: str, run: RunWatch) -> None:
        """The agent's last turn ended and nothing waits (no open question, no message not
        yet taken up): close its stdin so it exits; TERM, then KILL, if it lingers."""
        if self.ctx.questions.pending_for(agent_id):
            return
        handle = self.ctx.roster.handles.get(agent_id)
        if handle is None:
            return
        run.session_ended = True
        handle.close_stdin()
        self.ctx.background.spawn(f"end:{agent_id}", self._await_end(agent_id, handle))

    async def _await_end(self, agent_id: str, handle: AgentHandle) -> None:
        grace = self.ctx.settings.scheduler.stop_grace_seconds
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                log.warning(
                    "agent %s did not exit after its result; sending %s", agent_id, sig.name
                )
                await asyncio.to_thread(handle.signal, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if handle.exit_status() is not None or not handle.group_alive():
                    return
                await asyncio.sleep(0.02)
