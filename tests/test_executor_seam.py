"""The executor seam: another executor plugs in at the composition root, and every spawn,
signal and reattachment of an agent goes through it; the scheduler and the pool are the same.

The executor here is gridd's own local one behind a wrapper that logs what it is asked (a
seam of gridd's, not the thing under test: the agents are real processes)."""

from __future__ import annotations

import signal
from pathlib import Path

from gridd.grid import Grid
from gridd.model import Agent, TaskStatus
from gridd.runs.executor import AgentHandle, ExitStatus, Launch
from gridd.runs.local import LocalExecutor
from gridd.specs import PlanSpec, SessionStart, normalise_plan
from tests.support.daemons import inprocess_daemon
from tests.support.processes import kill_workspace_agents
from tests.support.repos import agent_command
from tests.support.waits import until


class LoggedHandle:
    """An ``AgentHandle`` that notes each signal before passing it on."""

    def __init__(self, inner: AgentHandle, calls: list[tuple[str, str]]) -> None:
        self.inner = inner
        self.calls = calls
        self.run_dir = inner.run_dir
        self.pid = inner.pid
        self.create_time = inner.create_time
        self.shim_pid = inner.shim_pid
        self.shim_create_time = inner.shim_create_time

    def exit_status(self) -> ExitStatus | None:
        return self.inner.exit_status()

    def alive(self) -> bool:
        return self.inner.alive()

    def group_alive(self) -> bool:
        return self.inner.group_alive()

    def shim_alive(self) -> bool:
        return self.inner.shim_alive()

    def signal(self, sig: int) -> bool:
        self.calls.append(("signal", f"{self.run_dir.name}:{signal.Signals(sig).name}"))
        return self.inner.signal(sig)

    def handles_signal(self, sig: int) -> bool:
        return self.inner.handles_signal(sig)

    def close_stdin(self) -> bool:
        return self.inner.close_stdin()

    def write_stdin(self, text: str) -> None:
        self.inner.write_stdin(text)


class LoggedExecutor:
    def __init__(self, runs_dir: Path) -> None:
        self.inner = LocalExecutor(runs_dir)
        self.calls: list[tuple[str, str]] = []

    def start(self) -> None:
        self.calls.append(("start", ""))
        self.inner.start()

    def close(self) -> None:
        self.calls.append(("close", ""))
        self.inner.close()

    async def spawn(self, launch: Launch) -> AgentHandle:
        self.calls.append(("spawn", launch.run_dir.name))
        return LoggedHandle(await self.inner.spawn(launch), self.calls)

    def reattach(self, agent: Agent) -> AgentHandle:
        self.calls.append(("reattach", agent.id))
        return LoggedHandle(self.inner.reattach(agent), self.calls)

    def abandon_start(self, run_dir: Path) -> None:
        self.calls.append(("abandon_start", run_dir.name))
        self.inner.abandon_start(run_dir)

    def fence(self, run_dir: Path) -> bool:
        self.calls.append(("fence", run_dir.name))
        return self.inner.fence(run_dir)


async def test_another_executor_spawns_and_signals_every_agent_through_the_seam(
    repo: Path, tmp_path: Path
) -> None:
    executor = LoggedExecutor(repo / ".grid" / "runs")
    config = {
        "scheduler": {"default_agent": "quick", "tick_seconds": 0.25, "stop_grace_seconds": 1.0},
        "agents": {
            "quick": {"command": agent_command("trivial.py", "0.2")},
            "hang": {"command": agent_command("hang.py", str(tmp_path))},
        },
    }
    try:
        async with inprocess_daemon(repo, config, executor=executor) as daemon:
            grid: Grid = daemon.grid
            assert grid.pool.executor is executor
            tasks = [
                {"id": "quick", "title": "finishes"},
                {"id": "stuck", "title": "stopped with the session", "agent": "hang"},
            ]
            grid.commands.create_tasks(
                PlanSpec.model_validate(normalise_plan({"tasks": tasks})).tasks
            )
            grid.commands.start_session(SessionStart.model_validate({"maxAgents": 2}))
            await until(
                lambda: grid.state.tasks["quick"].status == TaskStatus.REVIEW, what="quick done"
            )
            await until(lambda: (tmp_path / "stuck.pids").exists(), what="the hang agent")
            grid.commands.stop_session(force=False)  # SIGTERM, then SIGKILL after the grace
            await until(lambda: not grid.state.live_agents(), what="the hang agent stopped")
            agents = {a.task_id: a for a in grid.state.agents.values()}
            spawned = {name for kind, name in executor.calls if kind == "spawn"}
            assert spawned == {Path(a.run_dir).name for a in agents.values()}
            stuck_run = Path(agents["stuck"].run_dir).name
            signals = [name for kind, name in executor.calls if kind == "signal"]
            assert f"{stuck_run}:SIGTERM" in signals  # the stop went through its handle
    finally:
        kill_workspace_agents(repo)
    assert executor.calls[0] == ("start", "") and executor.calls[-1] == ("close", "")
