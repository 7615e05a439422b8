"""Reattaching after a restart: agents an earlier daemon started are watched again.

Their supervisors outlived that daemon, so the executor finds each one again from its record
(``Executor.reattach``). An agent recorded without a pid (that daemon died while spawning
it: the agent was recorded first, as the intent) is the reattach-or-respawn decision:
adopted from what its supervisor wrote if it runs or ran; if not, its run is fenced
(``Executor.fence``) so that no late supervisor can start it, and its task starts afresh;
if the supervisor took the run first, we wait for it to say the agent runs. So a task never
runs twice at once in its worktree, whenever the daemon died. The output index is lined up with what was
published, so no chunk is published twice or under two numbers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gridd.adapters.registry import get_adapter
from gridd.errors import GriddError
from gridd.lifecycle import move_agent
from gridd.model import Agent, AgentStatus, TaskStatus, utcnow
from gridd.pool.context import PoolContext
from gridd.pool.monitoring import Monitor
from gridd.runs.executor import AgentHandle, running_fields
from gridd.runs.watch import RunWatch

log = logging.getLogger(__name__)
T = TypeVar("T")

#: A supervisor that took a run says within this long that the agent runs (``agent.json``)
#: or could not start (``exit.json``): the spawn timeout.
SETTLE_SECONDS = 10.0
SETTLE_POLL_SECONDS = 0.02


class Reattacher:
    def __init__(self, ctx: PoolContext, *, monitor: Monitor) -> None:
        self.ctx = ctx
        self.monitor = monitor

    async def reattach(self, agent: Agent) -> None:
        """Resume watching an agent started by an earlier daemon (its shim outlived us), or,
        if that daemon died before the agent started, start its task afresh (never both)."""
        handle = await self._ask(agent, self.ctx.executor.reattach, agent)
        if agent.pid is None and handle.pid is None and handle.exit_status() is None:
            # Recorded, not known to run: fence the run, or learn that its supervisor has it.
            if await self._ask(agent, self.ctx.executor.fence, Path(agent.run_dir)):
                self._respawn(agent)
                return
            handle = await self._settled(agent, handle)
        if agent.pid is None and handle.pid is not None:
            # That daemon died while spawning it, after its supervisor started it.
            agent = move_agent(
                self.ctx.state,
                agent.id,
                AgentStatus.RUNNING,
                reason="adopted after a restart",
                **running_fields(agent, handle),
            )
        profile = self.ctx.profiles.get(agent.profile)
        try:
            adapter = get_adapter(agent.adapter, options=profile.adapter_options if profile else {})
        except GriddError:
            adapter = get_adapter("heartbeat")
        if argv := _spec_argv(Path(agent.run_dir)):
            adapter.adopt(argv)  # e.g. codex's model, for its price
        run = RunWatch(
            Path(agent.run_dir),
            adapter,
            heartbeat_offset=agent.heartbeat_offset,
            denied_offset=agent.denied_offset,
        )
        if adapter.ends_on_result:
            # It may have said its final word before we died: know it, to end the run.
            run.replay(agent.output_seq)
        self._resume_output(agent, run)
        run.last_life = time.monotonic()  # we cannot know; don't call it a launch failure
        if handle.exit_status() is None:
            await self._reopen_proxy(agent)
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
        self.monitor.spawn(agent.id)

    async def _reopen_proxy(self, agent: Agent) -> None:
        """A run whose network is ``allowlist`` gets its proxy back, on the port its
        Landlock ruleset names (its only way out). Taken meanwhile, the run has none."""
        box = agent.sandbox or {}
        port = box.get("proxyPort")
        if box.get("network") != "allowlist" or not isinstance(port, int):
            return
        try:
            await self.ctx.egress.open(agent.id, box.get("allowHosts") or [], port=port)
        except OSError as exc:
            warning = f"its sandbox's proxy could not listen again on port {port}: {exc}"
            log.warning("agent %s: %s", agent.id, warning)
            self.ctx.bus.publish("agent.warning", {"agentId": agent.id, "warning": warning})

    async def _settled(self, agent: Agent, handle: AgentHandle) -> AgentHandle:
        """Its supervisor took the run: wait until it says the agent runs (or could not
        start), then watch it as any other. Gone without a word, it is an orphaned run.
        Still silent after ``SETTLE_SECONDS`` but alive (stopped, or slow), it is watched
        through its supervisor: the task gets no second run while it may still start one."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while handle.pid is None and handle.exit_status() is None:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(SETTLE_POLL_SECONDS)
            handle = await self._ask(agent, self.ctx.executor.reattach, agent)
        return handle

    async def _ask(self, agent: Agent, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` of the executor about ``agent``'s run. A box's engine answers over
        podman or a cluster's API: in a thread, the loop serving on meanwhile. A local run's
        answer is a few file reads: here, so that nothing else runs between a restart's
        first look at the run and its registration (a claim's recheck, spawned before the
        reattach, counts on finding the run registered)."""
        if agent.executor:
            return await asyncio.to_thread(call, *args)
        return call(*args)

    def _respawn(self, agent: Agent) -> None:
        """The spawn never started: the agent is settled, and its task, still ``working``,
        gets a new agent from the next pass. The attempt it never ran is not counted."""
        state = self.ctx.state
        reason = "spawn interrupted by a daemon restart; the agent never started"
        move_agent(state, agent.id, AgentStatus.EXITED, reason=reason, ended_at=utcnow())
        task = state.tasks.get(agent.task_id)
        if task is not None and task.status == TaskStatus.WORKING:
            sessions = agent.session_number - 1
            # A first session counted a new attempt; a continued one did not.
            attempts = agent.attempt if sessions > 0 else agent.attempt - 1
            state.update_task(task.id, attempts=max(0, attempts), sessions=max(0, sessions))
        log.warning("agent %s: %s; its task starts again", agent.id, reason)
        self.ctx.bus.publish(
            "agent.spawn_interrupted",
            {"agentId": agent.id, "taskId": agent.task_id, "action": "respawn"},
        )

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


def _spec_argv(run_dir: Path) -> list[str]:
    """The argv a run was started with, from its ``spec.json`` ([] when unreadable)."""
    try:
        spec = json.loads((run_dir / "spec.json").read_text())
    except (OSError, ValueError):
        return []
    argv = spec.get("argv") if isinstance(spec, dict) else None
    return [str(a) for a in argv] if isinstance(argv, list) else []
