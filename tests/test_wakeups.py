"""Agent monitors wake on their agent's writes, never on a timer: output arrives complete and
in order however the notifications come (coalesced, or none at all, when the safety-net
sweep finds it), and a quiet daemon's monitors stay asleep."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gridd.grid import Grid
from gridd.liveness import Limits, assess, next_change
from gridd.runs.wakeups import Wakeups
from gridd.specs import PlanSpec, SessionStart, normalise_plan
from tests.support.daemons import inprocess_daemon
from tests.support.processes import kill_workspace_agents
from tests.support.repos import agent_command
from tests.support.waits import until


@asynccontextmanager
async def lines_agents(
    root: Path, *, agents: int, count: int, watch: dict[str, Any] | None = None
) -> AsyncIterator[tuple[Grid, Path]]:
    """``agents`` live ``lines.py`` agents (each said "ready") in an in-process daemon."""
    control = root.parent / f"{root.name}-control"
    control.mkdir()
    config = {
        "scheduler": {
            "default_agent": "lines",
            "tick_seconds": 0.25,
            "stop_grace_seconds": 1.0,
            "launch_grace_seconds": 300.0,
        },
        "agents": {"lines": {"command": agent_command("lines.py", str(control), str(count))}},
        "watch": watch or {},
    }
    try:
        async with inprocess_daemon(root, config) as daemon:
            grid: Grid = daemon.grid  # type: ignore[assignment]
            tasks = [{"id": f"t{i}", "title": f"lines {i}"} for i in range(agents)]
            grid.commands.create_tasks(
                PlanSpec.model_validate(normalise_plan({"tasks": tasks})).tasks
            )
            grid.commands.start_session(SessionStart.model_validate({"maxAgents": agents}))
            await until(
                lambda: sum(a.output_seq >= 1 for a in grid.state.live_agents()) == agents,
                what=f"{agents} agents saying ready",
            )
            try:
                yield grid, control
            finally:
                (control / "end").touch()
                grid.commands.stop_session(force=True)
                await until(lambda: not grid.pool.handles, timeout=20, what="agents gone")
    finally:
        kill_workspace_agents(root)


def output_by_agent(grid: Grid) -> dict[str, list[tuple[int, str]]]:
    """Every ``agent.output`` event logged, per agent, in log order: (seq, chunk)."""
    out: dict[str, list[tuple[int, str]]] = {}
    since = 0
    while batch := grid.store.events_after(since, types={"agent.output"}, limit=5000):
        for event in batch:
            out.setdefault(event.data["agentId"], []).append(
                (event.data["seq"], event.data["chunk"])
            )
        since = batch[-1].id
    return out


def assert_complete(grid: Grid, count: int) -> None:
    """Each agent's events hold seq 1, 2, 3... and exactly what it printed, in order."""
    outputs = output_by_agent(grid)
    for agent in grid.state.live_agents():
        events = outputs[agent.id]
        assert [seq for seq, _ in events] == list(range(1, len(events) + 1))
        task = agent.task_id
        expected = f"{task} ready\n" + "".join(f"{task} line {n}\n" for n in range(1, count + 1))
        assert "".join(chunk for _, chunk in events) == expected


async def test_output_is_complete_and_in_order_when_notifications_are_switched_off(
    repo: Path,
) -> None:
    async with lines_agents(
        repo, agents=3, count=300, watch={"notify": False, "fallback_seconds": 0.3}
    ) as (grid, control):
        wakeups = grid.pool.wakeups
        assert not wakeups.notifying
        (control / "go").touch()
        await until(lambda: all((control / f"t{i}.done").exists() for i in range(3)))
        await until(lambda: all(not r.unread() for r in grid.pool.runs.values()), what="read")
        await until(lambda: wakeups.sweep() == 0 and wakeups.sweeps > 0)
        assert_complete(grid, 300)
        totals = wakeups.totals()
        assert totals.notices == 0 and totals.swept > 0  # the sweep alone delivered it


async def test_output_lost_by_notifications_is_found_by_the_safety_net_sweep(
    repo: Path,
) -> None:
    async with lines_agents(repo, agents=2, count=200, watch={"sweep_seconds": 0.3}) as (
        grid,
        control,
    ):
        wakeups = grid.pool.wakeups
        assert wakeups.notifying
        # Lose every notification of one run, as an inotify queue overflow would.
        lost = next(iter(wakeups.runs.values()))
        wakeups.forget_notifications(lost)
        swept_before = lost.counts.swept
        (control / "go").touch()
        await until(lambda: all((control / f"t{i}.done").exists() for i in range(2)))
        await until(lambda: all(not r.unread() for r in grid.pool.runs.values()), what="read")
        assert_complete(grid, 200)
        assert lost.counts.swept > swept_before


async def test_a_burst_from_many_agents_at_once_arrives_complete_and_in_order(
    repo: Path,
) -> None:
    agents, count = 16, 400
    async with lines_agents(repo, agents=agents, count=count) as (grid, control):
        before = grid.pool.wakeups.totals()
        (control / "go").touch()
        await until(lambda: all((control / f"t{i}.done").exists() for i in range(agents)))
        await until(lambda: all(not r.unread() for r in grid.pool.runs.values()), what="read")
        assert_complete(grid, count)
        after = grid.pool.wakeups.totals()
        # Notifications coalesce: far fewer wake-ups than lines written.
        assert 0 < after.notices - before.notices < agents * count


async def test_a_quiet_daemons_watchers_do_not_wake(repo: Path) -> None:
    async with lines_agents(repo, agents=6, count=5, watch={"sweep_seconds": 0.2}) as (
        grid,
        control,
    ):
        wakeups = grid.pool.wakeups
        await until(lambda: all(not r.unread() for r in grid.pool.runs.values()), what="read")
        # The spawn's own last writes (agent.json) settle by the next sweep.
        settled = wakeups.sweeps + 1
        await until(lambda: wakeups.sweeps >= settled, what="a sweep")
        before, sweeps = wakeups.totals().wakeups, wakeups.sweeps
        await until(lambda: wakeups.sweeps >= sweeps + 3, what="three quiet sweeps")
        assert wakeups.totals().wakeups == before
        # ...while a single write wakes its monitor at once.
        (control / "go").touch()
        await until(lambda: wakeups.totals().wakeups > before, timeout=10)


async def test_a_watcher_wakes_when_its_shim_dies_without_an_exit_record(repo: Path) -> None:
    async with lines_agents(repo, agents=1, count=0) as (grid, _control):
        agent = grid.state.live_agents()[0]
        wake = next(iter(grid.pool.wakeups.runs.values()))
        assert wake.shim_watched
        assert agent.shim_pid is not None
        os.kill(agent.shim_pid, 9)
        await until(lambda: wake.counts.shim_exit == 1, timeout=10, what="shim exit noticed")


def test_wakeups_without_a_loop_or_runs_are_inert() -> None:
    wakeups = Wakeups(notify=False, fallback_seconds=0.1)
    assert wakeups.sweep() == 0 and wakeups.interval == 0.1
    wakeups.close()


def test_next_change_is_when_the_health_verdict_would_change() -> None:
    limits = Limits(launch_grace=10.0, stall=60.0, stall_kill=600.0)
    # No life yet: the launch grace ends at 10 s.
    due = next_change(now=4.0, started=0.0, last_life=None, limits=limits)
    assert due is not None and 6.0 < due < 6.1
    assert assess(now=4.0 + due, started=0.0, last_life=None, limits=limits) != "ok"
    # Alive at 100 s: stalled at 160 s, then killed at 700 s.
    due = next_change(now=120.0, started=0.0, last_life=100.0, limits=limits)
    assert due is not None and 40.0 < due < 40.1
    due = next_change(now=200.0, started=0.0, last_life=100.0, limits=limits)
    assert due is not None and 500.0 < due < 500.1
    assert next_change(now=800.0, started=0.0, last_life=100.0, limits=limits) is None
    none = Limits(launch_grace=None, stall=None, stall_kill=None)
    assert next_change(now=1.0, started=0.0, last_life=None, limits=none) is None
