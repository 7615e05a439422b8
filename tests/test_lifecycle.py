"""The task and agent state machines: the table itself (pure), and moves through the real
state cache and SQLite store: legal ones persisted, illegal ones refused and reported."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import gridd.lifecycle as lifecycle
from gridd.errors import ValidationFailed
from gridd.events import EventBus
from gridd.lifecycle import (
    AGENT_TRANSITIONS,
    TASK_TRANSITIONS,
    IllegalTransition,
    Move,
    agent_can_move,
    move_agent,
    move_task,
    move_tasks,
    task_can_move,
)
from gridd.model import TERMINAL_TASK_STATUSES, Agent, AgentStatus, Task, TaskStatus
from gridd.state import GridState, StatusBypass
from gridd.store import Store

T = TaskStatus
A = AgentStatus

# -- the table (pure) ----------------------------------------------------------------------------


def test_every_status_has_a_row_and_every_target_is_a_status() -> None:
    assert set(TASK_TRANSITIONS) == set(TaskStatus)
    assert set(AGENT_TRANSITIONS) == set(AgentStatus)
    for targets in TASK_TRANSITIONS.values():
        assert targets <= set(TaskStatus)


def test_done_and_cancelled_are_terminal_and_exited_agents_stay_exited() -> None:
    for status in (T.DONE, T.CANCELLED):
        assert TASK_TRANSITIONS[status] == frozenset()
    assert AGENT_TRANSITIONS[A.EXITED] == frozenset()
    # failed is terminal on its own (TERMINAL_TASK_STATUSES) but a human may start it again
    assert T.FAILED in TERMINAL_TASK_STATUSES
    assert TASK_TRANSITIONS[T.FAILED] == {T.WORKING, T.CANCELLED}


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (T.REVIEW, T.MERGING),
        (T.MERGING, T.DONE),
        (T.MERGING, T.REVIEW),
        (T.MERGING, T.WORKING),
        (T.MERGING, T.FAILED),
        (T.WORKING, T.REVIEW),
        (T.WORKING, T.RATE_LIMITED),
        (T.RATE_LIMITED, T.READY),
        (T.PENDING, T.READY),
        (T.BLOCKED, T.PENDING),
    ],
)
def test_the_merge_queue_and_the_scheduler_moves_are_legal(
    current: TaskStatus, target: TaskStatus
) -> None:
    assert task_can_move(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (T.DONE, T.WORKING),
        (T.CANCELLED, T.READY),
        (T.PENDING, T.DONE),  # nothing is done without review
        (T.PENDING, T.REVIEW),  # review needs an agent's run
        (T.RATE_LIMITED, T.REVIEW),  # a parked task has no run to finish
        (T.CANCELLED, T.REVIEW),  # a cancel after a completed run keeps it cancelled
        (T.FAILED, T.DONE),
        (T.MERGING, T.READY),
    ],
)
def test_moves_that_would_skip_a_step_are_illegal(current: TaskStatus, target: TaskStatus) -> None:
    assert not task_can_move(current, target)


def test_a_completed_run_reaches_review_from_where_a_stop_or_kill_that_came_later_left_it() -> None:
    # The agent exited 0; then a stop (task ready), session stop (ready) or kill (blocked)
    # came in before its finish moved the task: the run's result still goes to review.
    assert task_can_move(T.READY, T.REVIEW)
    assert task_can_move(T.BLOCKED, T.REVIEW)
    # Those are the only new ways in: review is reached by a run's finish (working, or
    # ready/blocked after such a race) or by the merge queue sending a task back.
    into_review = {s for s, targets in TASK_TRANSITIONS.items() if T.REVIEW in targets}
    assert into_review == {T.WORKING, T.READY, T.BLOCKED, T.MERGING}
    # A cancel that came later leaves the task cancelled (terminal): the finish keeps the
    # result on the task's branch (keptBranch) instead.
    assert not task_can_move(T.CANCELLED, T.REVIEW)


def test_staying_in_a_status_is_always_allowed() -> None:
    assert all(task_can_move(s, s) for s in TaskStatus)
    assert all(agent_can_move(s, s) for s in AgentStatus)
    assert not agent_can_move(A.STOPPING, A.RUNNING)
    assert not agent_can_move(A.EXITED, A.RUNNING)


def _documented(kind: type[TaskStatus] | type[AgentStatus]) -> dict[str, set[str]]:
    doc = lifecycle.__doc__ or ""
    names = {s.value for s in kind}
    rows: dict[str, set[str]] = {}
    for line in doc.splitlines():
        match = re.match(r"^\s+(\w+)\s+->\s+(.*)$", line)
        if match and match.group(1) in names:
            targets = match.group(2).strip()
            rows[match.group(1)] = (
                set() if targets.startswith("(") else {t.strip() for t in targets.split(",")}
            )
    return rows


def test_the_table_in_the_docstring_is_the_table_in_the_code() -> None:
    assert _documented(TaskStatus) == {
        s.value: {t.value for t in targets} for s, targets in TASK_TRANSITIONS.items()
    }
    assert _documented(AgentStatus) == {
        s.value: {t.value for t in targets} for s, targets in AGENT_TRANSITIONS.items()
    }


# -- moves through the real state cache and store ----------------------------------------------


@pytest.fixture
def state(tmp_path: Path) -> Iterator[GridState]:
    store = Store.open(tmp_path / "gridd.db")
    state = GridState(store, EventBus(store, queue_size=100))
    state.add_tasks(
        [Task(id="t1", title="one", status=T.PENDING), Task(id="t2", title="two", status=T.READY)]
    )
    yield state
    store.close()


def _reloaded(state: GridState) -> dict[str, Task]:
    return {t.id: t for t in state.store.load_tasks()}


def test_a_legal_move_is_persisted_with_its_reason(state: GridState) -> None:
    moved = move_task(state, "t2", T.WORKING, reason="scheduled", attempts=1)
    assert moved.status == T.WORKING and moved.status_reason == "scheduled"
    stored = _reloaded(state)["t2"]
    assert (stored.status, stored.status_reason, stored.attempts) == (T.WORKING, "scheduled", 1)
    assert stored.status_changed_at is not None


def test_an_illegal_move_is_refused_reported_and_never_persisted(
    state: GridState, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(IllegalTransition) as raised:
        move_task(state, "t1", T.DONE, reason="a bug", error="x")
    assert raised.value.status == 409
    assert raised.value.details == {"kind": "task", "id": "t1", "from": "pending", "to": "done"}
    assert state.tasks["t1"].status == T.PENDING
    assert _reloaded(state)["t1"].status == T.PENDING
    events = state.store.events_after(0, types=["lifecycle.illegal_transition"])
    assert [e.data for e in events] == [
        {"kind": "task", "id": "t1", "from": "pending", "to": "done", "reason": "a bug"}
    ]
    assert "illegal task transition t1: pending -> done" in caplog.text


def test_a_batch_applies_the_legal_moves_and_reports_the_illegal_ones(state: GridState) -> None:
    moved = move_tasks(
        state, {"t1": Move(T.REVIEW, "a bug"), "t2": Move(T.BLOCKED, "dependency x")}
    )
    assert [t.id for t in moved] == ["t2"]
    stored = _reloaded(state)
    assert (stored["t1"].status, stored["t2"].status) == (T.PENDING, T.BLOCKED)
    assert len(state.store.events_after(0, types=["lifecycle.illegal_transition"])) == 1


def test_field_updates_cannot_change_a_status_behind_the_lifecycle(state: GridState) -> None:
    with pytest.raises(StatusBypass):
        state.update_task("t1", status=T.DONE)
    with pytest.raises(StatusBypass):
        state.update_tasks({"t1": {"status": T.DONE}})
    assert _reloaded(state)["t1"].status == T.PENDING


def test_field_updates_are_validated_like_the_api_and_unknown_fields_refused(
    state: GridState,
) -> None:
    for bad in ({"title": None}, {"priority": 9}, {"labels": None}, {"max_attempts": 0}):
        with pytest.raises(ValidationFailed):
            state.update_task("t1", **bad)
    with pytest.raises(ValidationFailed) as raised:
        state.update_task("t1", colour="blue")
    assert raised.value.code == "unknown_field"
    assert _reloaded(state)["t1"] == state.tasks["t1"]
    assert state.tasks["t1"].title == "one"


def test_an_exited_agent_cannot_come_back(state: GridState) -> None:
    state.put_agent(Agent(id="a1", task_id="t1", profile="p", worktree_path="/w"))
    move_agent(state, "a1", A.RUNNING, reason="spawned", pid=123)
    move_agent(state, "a1", A.EXITED, reason="exited (0)")
    with pytest.raises(IllegalTransition):
        move_agent(state, "a1", A.RUNNING, reason="a bug")
    stored = {a.id: a for a in state.store.load_agents()}["a1"]
    assert (stored.status, stored.status_reason) == (A.EXITED, "exited (0)")
    with pytest.raises(StatusBypass):
        state.update_agent("a1", status=A.RUNNING)


# -- creation and the session ----------------------------------------------------------------------


def test_a_new_task_is_born_ready_pending_or_blocked_as_its_dependencies_stand(
    state: GridState,
) -> None:
    move_task(state, "t1", T.CANCELLED, reason="not wanted")
    born = lifecycle.first_statuses(
        [
            Task(id="free", title="no dependencies"),
            Task(id="waits", title="waits on t2", depends_on=["t2"]),
            Task(id="dead", title="waits on a cancelled task", depends_on=["t1"]),
        ],
        state.statuses(),
    )
    assert {t.id: t.status for t in born} == {
        "free": T.READY,
        "waits": T.PENDING,
        "dead": T.BLOCKED,
    }
    lifecycle.create_tasks(state, born)
    assert {t: _reloaded(state)[t].status for t in ("free", "waits", "dead")} == {
        "free": T.READY,
        "waits": T.PENDING,
        "dead": T.BLOCKED,
    }


def test_a_task_born_in_a_later_status_is_refused_and_reported(state: GridState) -> None:
    with pytest.raises(IllegalTransition):
        lifecycle.create_tasks(state, [Task(id="t3", title="three", status=T.DONE)])
    assert "t3" not in state.tasks and "t3" not in _reloaded(state)
    events = state.store.events_after(0, types=["lifecycle.illegal_transition"])
    assert [(e.data["id"], e.data["to"]) for e in events] == [("t3", "done")]


def test_an_agent_is_born_starting_and_only_once(state: GridState) -> None:
    agent = Agent(id="a1", task_id="t1", profile="p", worktree_path="/w")
    assert lifecycle.create_agent(state, agent).status == A.STARTING
    with pytest.raises(IllegalTransition):
        lifecycle.create_agent(state, agent)  # a second record of the same agent
    with pytest.raises(IllegalTransition):
        lifecycle.create_agent(state, agent.model_copy(update={"id": "a2", "status": A.RUNNING}))
    assert sorted(a.id for a in state.store.load_agents()) == ["a1"]


def test_a_session_starts_once_and_stops_through_the_lifecycle(state: GridState) -> None:
    started = lifecycle.start_session(state, feature_branch="f", max_agents=2, budget_usd=1.0)
    assert started.started and started.started_at is not None
    with pytest.raises(IllegalTransition):
        lifecycle.start_session(state, feature_branch="g", max_agents=1, budget_usd=None)
    assert state.session.feature_branch == "f"
    with pytest.raises(StatusBypass):
        lifecycle.update_session(state, started=False)
    assert lifecycle.update_session(state, max_agents=5).max_agents == 5
    stopped = lifecycle.stop_session(state, "user")
    assert (stopped.started, stopped.stop_reason) == (False, "user")
    assert lifecycle.stop_session(state, "shutdown").stop_reason == "shutdown"  # stopped again
    again = lifecycle.start_session(state, feature_branch="g", max_agents=1, budget_usd=None)
    assert (again.started, again.feature_branch, again.stop_reason) == (True, "g", None)


def test_the_session_table_in_the_docstring_is_the_table_in_the_code() -> None:
    doc = lifecycle.__doc__ or ""
    rows = {
        m.group(1): {m.group(2).strip()}
        for m in re.finditer(r"^\s+(started|stopped)\s+->\s+(\w+)\s*$", doc, re.M)
    }
    assert rows == {s: set(t) for s, t in lifecycle.SESSION_TRANSITIONS.items()}
