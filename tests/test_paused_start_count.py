"""A start the disk paused counts no attempt, even when the disk refuses to record that it
took the attempt back: its next start is still its first (issue 30, "faults are seen and
reported, never spent").

In-process daemon, real agents. The executor is gridd's local one behind a wrapper (the
seam) whose first spawn fails with ENOSPC, as a full disk makes it; the moment the daemon
notes the full disk (its ``daemon.degraded`` event), the state database stops taking
writes too: another process holds it locked, a write is queued behind the lock, and the
store has met the full disk (``write_error``), as on a disk that filled up between the
attempt's record and the spawn. Then the lock goes, the writes commit, the fault clears and
the task starts again.
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from gridd.errors import StoreError
from gridd.grid import Grid
from gridd.model import Agent, Event, TaskStatus
from gridd.runs.executor import AgentHandle, Launch
from gridd.runs.local import LocalExecutor
from gridd.specs import PlanSpec, SessionStart, normalise_plan
from tests.support.daemons import inprocess_daemon
from tests.support.processes import kill_workspace_agents
from tests.support.repos import FAST_SCHEDULER
from tests.support.waits import until


class FullOnce:
    """The local executor, except that its first spawn fails as on a full disk."""

    def __init__(self, runs_dir: Path) -> None:
        self.inner = LocalExecutor(runs_dir)
        self.spawns = 0

    def start(self) -> None:
        self.inner.start()

    def close(self) -> None:
        self.inner.close()

    async def spawn(self, launch: Launch) -> AgentHandle:
        self.spawns += 1
        if self.spawns == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return await self.inner.spawn(launch)

    def reattach(self, agent: Agent) -> AgentHandle:
        return self.inner.reattach(agent)

    def abandon_start(self, run_dir: Path) -> None:
        self.inner.abandon_start(run_dir)

    def fence(self, run_dir: Path) -> bool:
        return self.inner.fence(run_dir)


async def test_a_paused_start_whose_take_back_the_disk_refused_still_counts_no_attempt(
    repo: Path,
) -> None:
    executor = FullOnce(repo / ".grid" / "runs")
    config = {
        "scheduler": {**FAST_SCHEDULER, "default_agent": "idle"},
        "agents": {"idle": {"command": ["sleep", "60"]}},
    }
    holder: sqlite3.Connection | None = None
    try:
        async with inprocess_daemon(repo, config, executor=executor) as daemon:
            grid: Grid = daemon.grid

            def refuse_writes(event: Event) -> None:
                nonlocal holder
                if holder is not None or event.type != "daemon.degraded":
                    return
                if event.data.get("part") != "disk":
                    return
                holder = sqlite3.connect(grid.store.path, isolation_level=None, timeout=0)
                holder.execute("BEGIN EXCLUSIVE")
                grid.bus.publish("test.queued", {})  # waits behind the lock: queued
                grid.store.write_error = StoreError("the disk is full", code="disk_full")

            grid.bus.add_listener(refuse_writes)
            tasks = [{"id": "only", "title": "one attempt", "maxAttempts": 3}]
            grid.commands.create_tasks(
                PlanSpec.model_validate(normalise_plan({"tasks": tasks})).tasks
            )
            grid.commands.start_session(SessionStart.model_validate({"maxAgents": 1}))
            await until(lambda: holder is not None, what="the full disk noted")
            await until(lambda: "only" not in grid.pool.starting, what="the start paused")
            task = grid.state.tasks["only"]
            assert task.status == TaskStatus.WORKING
            assert holder is not None
            holder.execute("ROLLBACK")
            holder.close()
            holder = None
            await until(
                lambda: (
                    grid.state.agent_for_task("only") is not None
                    and grid.state.agent_for_task("only").pid is not None
                ),  # type: ignore[union-attr]
                what="the task started again once the disk took writes",
            )
            agent = grid.state.agent_for_task("only")
            assert agent is not None
            assert executor.spawns == 2
            assert agent.attempt == 1, agent
            assert grid.state.tasks["only"].attempts == 1
            grid.commands.stop_session(force=True)
            await until(lambda: not grid.pool.handles, what="the agent gone")
    finally:
        if holder is not None:
            holder.close()
        kill_workspace_agents(repo)
