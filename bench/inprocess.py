"""An in-process Grid with a session full of idle agents, for benchmarks that time the
scheduler itself (``run_pass``) rather than anything over the socket."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from bench.common import make_repo, remove_repo
from bench.harness import kill_agents


@contextlib.asynccontextmanager
async def busy_grid(
    plan: list[dict[str, Any]], *, max_agents: int
) -> AsyncIterator[tuple[Any, dict[str, float]]]:
    """``(grid, timings)``: a started Grid holding ``plan`` with ``max_agents`` idle agents
    (``sleep 300``) running, and how long validating and creating the plan took; stopped,
    cleaned up and its repository removed afterwards."""
    from gridd.compose import compose
    from gridd.settings import AgentProfile, SchedulerSettings, Settings
    from gridd.specs import PlanSpec, SessionStart, normalise_plan
    from gridd.store import Store
    from gridd.workspace import Workspace

    root = make_repo()
    ws = Workspace(root=root)
    ws.ensure_grid_dir()
    settings = Settings(
        agents={"idle": AgentProfile(command=["sleep", "300"])},
        scheduler=SchedulerSettings(default_agent="idle"),
    )
    store = Store.open(ws.db_path)
    grid = compose(workspace=ws, settings=settings, store=store, environ=os.environ)
    try:
        await grid.start()
        started = time.perf_counter()
        spec = PlanSpec.model_validate(normalise_plan({"tasks": plan}))
        validated = time.perf_counter()
        grid.commands.create_tasks(spec.tasks)
        timings = {
            "validate_s": round(validated - started, 3),
            "create_tasks_s": round(time.perf_counter() - validated, 3),
        }
        grid.commands.start_session(SessionStart.model_validate({"maxAgents": max_agents}))
        deadline = time.monotonic() + 30
        while True:
            running = [a for a in grid.state.live_agents() if a.pid is not None]
            if len(running) >= max_agents and not grid.pool.starting:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(running)} of {max_agents} agents started")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        yield grid, timings
    finally:
        if grid.state.session.started:
            grid.commands.stop_session(force=True)
        deadline = time.monotonic() + 10
        while grid.state.live_agents() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await grid.stop()
        store.close()
        kill_agents(root)
        remove_repo(root)
