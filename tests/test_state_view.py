"""``GET /state`` comes from the state cache (live agents and tasks encoded once per change,
never a walk over everything that ever ran), and long lists come in pages."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from gridd.events import EventBus
from gridd.lifecycle import move_agent, move_task
from gridd.model import Agent, AgentStatus, Task, TaskStatus
from gridd.state import GridState
from gridd.store import Store
from tests.support.daemons import DaemonProc


def _state(tmp_path: Path) -> GridState:
    store = Store.open(tmp_path / "grid.db")
    return GridState(store, EventBus(store, queue_size=16))


def _agent(i: int) -> Agent:
    return Agent(
        id=f"a-{i}",
        task_id=f"t{i}",
        profile="example",
        worktree_path="/tmp/w",
        attempt=1,
        run_dir=f"/tmp/r{i}",
    )


def test_the_cached_state_follows_every_agent_and_task_change(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.add_tasks([Task(id=f"t{i}", title=f"task {i}") for i in range(3)])
    for i in range(3):
        state.put_agent(_agent(i))
    assert [a["id"] for a in json.loads(state.live_agents_json())] == ["a-0", "a-1", "a-2"]
    state.update_agent("a-1", persist=False, last_output="hello")
    listed = json.loads(state.live_agents_json())
    assert listed[1]["lastOutput"] == "hello"
    move_agent(state, "a-0", AgentStatus.EXITED, reason="exited (0)")
    assert [a["id"] for a in json.loads(state.live_agents_json())] == ["a-1", "a-2"]
    assert [a.id for a in state.live_agents()] == ["a-1", "a-2"]
    assert state.agent_for_task("t0") is None and state.agent_for_task("t1") is not None
    assert state.stats().pending == 3
    move_task(state, "t2", TaskStatus.READY, reason="dependencies done")
    assert (state.stats().pending, state.stats().ready) == (2, 1)
    assert [t["status"] for t in json.loads(state.tasks_json())] == [
        "pending",
        "pending",
        "ready",
    ]
    # A fresh cache over the same store sees the same live set.
    again = GridState(state.store, state.bus)
    assert [a.id for a in again.live_agents()] == ["a-1", "a-2"]
    state.store.close()


def _http(daemon: DaemonProc) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.sock)), base_url="http://g")


def test_long_lists_come_in_pages_with_a_cursor_to_the_next(daemon: DaemonProc) -> None:
    with _http(daemon) as http:
        tasks = [{"id": f"p{i:02d}", "title": f"task {i}"} for i in range(25)]
        assert http.post("/tasks", json=tasks).status_code == 201
        seen: list[str] = []
        after = None
        pages = 0
        while True:
            params = {"limit": "10", **({"after": after} if after else {})}
            response = http.get("/tasks", params=params)
            assert response.status_code == 200
            seen += [t["id"] for t in response.json()]
            pages += 1
            after = response.headers.get("grid-next-after")
            if after is None:
                break
        assert pages == 3 and seen == [t["id"] for t in tasks]
        # Filters and pages combine; the whole list is still there without them.
        ready = http.get("/tasks", params={"status": "ready,pending", "limit": "5"})
        assert len(ready.json()) == 5 and ready.headers["grid-next-after"] == "p04"
        assert len(http.get("/tasks").json()) == 25
        assert http.get("/agents", params={"all": "1", "limit": "5"}).json() == []
        assert http.get("/questions", params={"limit": "5"}).json() == []
        bad = http.get("/tasks", params={"after": "nope"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_cursor"
        assert http.get("/tasks", params={"limit": "0"}).status_code == 422
        assert http.get("/tasks", params={"limit": "x"}).status_code == 400
