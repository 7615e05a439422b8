"""A big state's passes plan on a worker thread: the event loop goes on answering while
``plan()`` looks at every task, and a plan made from a state that changed meanwhile is
thrown away and made again, never applied.

In-process daemon, real agents (``sleep``). The threshold is lowered to 0 so that three
tasks make a "big" state; ``plan`` is wrapped (at the scheduler's own seam) so that its
first call waits until the test has changed the state: the interleaving is forced, not
hoped for.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gridd import scheduler as scheduler_module
from gridd.grid import Grid
from gridd.model import TaskStatus
from gridd.plan import Action, Observed, StartTask
from gridd.specs import PlanSpec, SessionStart, normalise_plan
from tests.support.daemons import inprocess_daemon
from tests.support.processes import kill_workspace_agents
from tests.support.repos import FAST_SCHEDULER
from tests.support.waits import until


async def test_a_plan_made_off_the_loop_from_a_state_that_changed_meanwhile_is_not_applied(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_module, "PLAN_OFF_LOOP_ABOVE", 0)
    real_plan = scheduler_module.plan
    entered = threading.Event()
    release = threading.Event()
    plans: list[list[Action]] = []

    def gated_plan(observed: Observed) -> list[Action]:
        if observed.session_started and not release.is_set():
            entered.set()
            release.wait(15)  # on the loop (before), this held everything for 15 s
        actions = real_plan(observed)
        plans.append(actions)
        return actions

    monkeypatch.setattr(scheduler_module, "plan", gated_plan)
    config = {
        "scheduler": {**FAST_SCHEDULER, "default_agent": "idle"},
        "agents": {"idle": {"command": ["sleep", "60"]}},
    }
    try:
        async with inprocess_daemon(repo, config) as daemon:
            grid: Grid = daemon.grid
            tasks = [
                {"id": "first", "title": "first in line", "priority": 0},
                {"id": "second", "title": "second in line", "priority": 1},
                {"id": "third", "title": "third in line", "priority": 2},
            ]
            grid.commands.create_tasks(
                PlanSpec.model_validate(normalise_plan({"tasks": tasks})).tasks
            )
            grid.commands.start_session(SessionStart.model_validate({"maxAgents": 1}))
            # The pass is planning (it would start "first"); the loop still runs this test.
            await until(
                entered.is_set, what="the scheduler to plan with the session started", timeout=20
            )
            await grid.commands.cancel_task("first")
            release.set()
            await until(
                lambda: grid.state.agent_for_task("second") is not None,
                what="an agent for the next task in line",
                timeout=20,
            )
            assert grid.state.tasks["first"].status == TaskStatus.CANCELLED
            assert not [a for a in grid.state.agents.values() if a.task_id == "first"]
            # The stale plan said "start first"; the one applied was made again after the
            # cancel, and started the next task instead.
            starts = [[a.task_id for a in p if isinstance(a, StartTask)] for p in plans]
            assert ["first"] in starts
            assert starts.index(["second"]) > starts.index(["first"])
            grid.commands.stop_session(force=True)
            await until(lambda: not grid.pool.handles, what="the agents gone", timeout=20)
    finally:
        release.set()
        kill_workspace_agents(repo)
