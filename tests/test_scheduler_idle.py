"""The scheduler's idle check: a pass with nothing changed costs O(1), not a walk of every
live agent, and an agent running past its timeout still makes the next pass a real one.

The scheduler is built around plain stand-ins for the state and the pool: the idle check
only reads a revision, the live agents, their start times and the profiles' timeouts."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from gridd.diskfault import DiskFault
from gridd.scheduler import Scheduler
from gridd.settings import AgentProfile, Settings


class _State:
    def __init__(self, agents: list[Any]) -> None:
        self.revision = 1
        self.agents = agents
        self.walks = 0
        self.tasks: dict[str, Any] = {}

    def on_change(self, waker: Any) -> None:
        pass

    def live_agents(self) -> list[Any]:
        self.walks += 1
        return list(self.agents)


def _scheduler(tmp_path: Path, n: int) -> tuple[Scheduler, _State, Any]:
    agents = [SimpleNamespace(id=f"a{i}", task_id=f"t{i}", profile="work") for i in range(n)]
    state = _State(agents)
    now = time.monotonic()
    pool = SimpleNamespace(
        not_before={},
        profiles={"work": AgentProfile(command=["true"], timeout_seconds=60.0)},
        started_mono={a.id: now for a in agents},
    )
    ws = SimpleNamespace(stop_file=tmp_path / "STOP")
    scheduler = Scheduler(
        workspace=cast(Any, ws),
        settings=Settings(),
        state=cast(Any, state),
        bus=cast(Any, None),
        pool=cast(Any, pool),
        background=cast(Any, None),
        disk=DiskFault(tmp_path),
    )
    return scheduler, state, pool


def test_idle_checks_do_not_walk_the_live_agents_until_something_changes(
    tmp_path: Path,
) -> None:
    scheduler, state, _pool = _scheduler(tmp_path, 256)
    first = scheduler._idle_key()
    for _ in range(100):
        assert scheduler._idle_key() == first
    assert state.walks == 1
    state.revision += 1  # an agent came or went, a task changed: deadlines are rebuilt
    scheduler._idle_key()
    assert state.walks == 2


def test_an_agent_past_its_timeout_changes_the_idle_key_without_a_revision(
    tmp_path: Path,
) -> None:
    scheduler, state, pool = _scheduler(tmp_path, 3)
    before = scheduler._idle_key()
    # a1 started long ago (a reattached agent): it is overdue now, and only it.
    pool.started_mono["a1"] = time.monotonic() - 120.0
    pool.started_mono["late"] = time.monotonic()  # a start the next revision will bring
    after = scheduler._idle_key()
    assert after != before
    assert after[3] == ("a1",)
    assert after[0] == before[0] == state.revision
