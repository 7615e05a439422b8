"""Reattaching after a restart: agents an earlier daemon started are watched again.

Their supervisors outlived that daemon, so the executor finds each one again from its record
(``Executor.reattach``); an agent recorded without a pid (that daemon died while spawning
it) is adopted from what its supervisor wrote. The output index is lined up with what was
published, so no chunk is published twice or under two numbers.
"""

from __future__ import annotations

import time
from pathlib import Path

from gridd.adapters.registry import get_adapter
from gridd.agents.watch import RunWatch
from gridd.errors import GriddError
from gridd.lifecycle import move_agent
from gridd.model import Agent, AgentStatus, utcnow
from gridd.pool.context import PoolContext
from gridd.pool.watching import Watcher


class Reattacher:
    def __init__(self, ctx: PoolContext, *, watcher: Watcher) -> None:
        self.ctx = ctx
        self.watcher = watcher

    def reattach(self, agent: Agent) -> None:
        """Resume watching an agent started by an earlier daemon (its shim outlived us)."""
        handle = self.ctx.executor.reattach(agent)
        if agent.pid is None and handle.pid is not None:
            # That daemon died while spawning it, after its supervisor started it.
            agent = move_agent(
                self.ctx.state,
                agent.id,
                AgentStatus.RUNNING,
                reason="adopted after a restart",
                pid=handle.pid,
                create_time=handle.create_time,
                shim_pid=handle.shim_pid,
                shim_create_time=handle.shim_create_time,
            )
        profile = self.ctx.profiles.get(agent.profile)
        try:
            adapter = get_adapter(agent.adapter, options=profile.adapter_options if profile else {})
        except GriddError:
            adapter = get_adapter("heartbeat")
        run = RunWatch(Path(agent.run_dir), adapter, heartbeat_offset=agent.heartbeat_offset)
        if adapter.ends_on_result:
            # It may have said its final word before we died: know it, to end the run.
            run.replay(agent.output_seq)
        self._resume_output(agent, run)
        run.last_life = time.monotonic()  # we cannot know; don't call it a launch failure
        self.ctx.roster.handles[agent.id] = handle
        self.ctx.roster.runs[agent.id] = run
        elapsed = (utcnow() - agent.started_at).total_seconds()
        self.ctx.roster.started_mono[agent.id] = time.monotonic() - max(0.0, elapsed)
        self.ctx.bus.publish(
            "agent.reattached",
            {
                "agentId": agent.id,
                "taskId": agent.task_id,
                "pid": agent.pid,
                "alive": handle.alive(),
                "exited": handle.exit_status() is not None,
            },
        )
        self.watcher.spawn(agent.id)

    def _resume_output(self, agent: Agent, run: RunWatch) -> None:
        """Line the output index up with what was published (``agent.output_seq``)."""
        published, indexed = agent.output_seq, run.output.seq
        if indexed > published:
            # Indexed, then the daemon died before publishing: they go out first.
            run.pending = run.output.read_since(published, limit=indexed - published)
        elif indexed < published:
            # The index lost records that were published: keep their numbers taken, so no
            # seq is ever given to two different chunks.
            run.output.skip_to(published)
            self.ctx.bus.publish(
                "agent.warning",
                {
                    "agentId": agent.id,
                    "warning": f"output index {run.output.idx_path} held {indexed} of the"
                    f" {published} chunks already published; output from there on may repeat",
                },
            )
