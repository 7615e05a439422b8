"""The task, agent and session state machines: the statuses, one table of legal moves each,
and the only code that creates a task, an agent or a session's run, or changes a status.

Modelled on Kubernetes pod phases and containerd task states: few states, explicit
transitions, and the reason stored next to the state (``Task.status_reason``,
``Agent.status_reason``). Every room that wants a task or an agent in another status asks
this module (``move_task``, ``move_tasks``, ``move_agent``), and every new one is born here
(``create_tasks``, ``create_agent``: a task's first status is decided by ``first_statuses``,
an agent's is ``starting``); ``GridState.update_task`` and ``update_agent`` refuse a
``status`` of their own. The session is started and stopped here too (``start_session``,
``stop_session``; ``update_session`` changes its other fields). Each move is validated by the
same pydantic models as the API before anything is written. A test
(``tests/test_state_owners.py``) reads every module's source and fails on a status written
anywhere else.

An illegal move is a bug in gridd, not a user error: it is reported (a
``lifecycle.illegal_transition`` event and an error in the log), never persisted, and
``IllegalTransition`` (a 409) is raised to the caller. Commands that refuse a user's request
ask ``task_can_move`` first and answer with their own 409.

The tables (read a row as "from this status, a task may move to ...")::

    pending       -> ready, blocked, working, cancelled
    ready         -> pending, blocked, working, review, cancelled
    working       -> ready, review, failed, blocked, cancelled, rate_limited
    review        -> merging, done, ready, working, blocked, failed, cancelled
    merging       -> done, review, working, failed, cancelled
    rate_limited  -> ready, working, cancelled
    blocked       -> pending, ready, working, review, cancelled
    failed        -> working, cancelled
    done          -> (terminal)
    cancelled     -> (terminal)

    starting      -> running, waiting, stopping, exited
    running       -> waiting, stopping, exited
    waiting       -> running, stopping, exited
    stopping      -> exited
    exited        -> (terminal)

    stopped       -> started
    started       -> stopped

A new task is ``ready``, ``pending`` or ``blocked`` (``first_statuses``: as its dependencies
stand); a new agent is ``starting``. The last two rows are the session's: ``start_session``
is the one move from stopped to started (a started session is changed with
``update_session``, never started again), and ``stop_session`` moves a started session to
stopped, or records a new reason on a stopped one.

Staying in the same status is always allowed (a move that only updates fields and the
reason).

``ready -> review`` and ``blocked -> review`` are one case: a run that completed before the
stop (``ready``) or kill (``blocked``) of its task reached it keeps its result
(``finish.py``). A cancel that comes after a completed run keeps the task ``cancelled``
(terminal); its work stays on the task's branch, named as ``keptBranch``. ``blocked ->
review`` is also a human's answer to a run that left a merge conflict unresolved: resolved
in the worktree, or sent to review as it is (``git/unresolved.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gridd.changes import validated_agent, validated_session, validated_task
from gridd.errors import Conflict
from gridd.lean import BulkPace
from gridd.model import Agent, AgentStatus, SessionState, Task, TaskStatus, utcnow
from gridd.plan import readiness
from gridd.state import StatusBypass

if TYPE_CHECKING:
    from gridd.state import GridState

log = logging.getLogger(__name__)

T = TaskStatus
A = AgentStatus

#: The task state machine. ``merging`` belongs to the merge queue: approved, queued or being
#: merged; it ends ``done`` (merged), back in ``review`` (conflict or failed check), back to
#: ``working`` (its agent fixes it) or ``failed``. Only a finished run moves a task to
#: ``review``: from ``working``, or from ``ready``/``blocked`` when a stop or kill came after the
#: run had completed (the result is kept, never thrown away).
TASK_TRANSITIONS: Mapping[TaskStatus, frozenset[TaskStatus]] = {
    T.PENDING: frozenset({T.READY, T.BLOCKED, T.WORKING, T.CANCELLED}),
    T.READY: frozenset({T.PENDING, T.BLOCKED, T.WORKING, T.REVIEW, T.CANCELLED}),
    T.WORKING: frozenset({T.READY, T.REVIEW, T.FAILED, T.BLOCKED, T.CANCELLED, T.RATE_LIMITED}),
    T.REVIEW: frozenset({T.MERGING, T.DONE, T.READY, T.WORKING, T.BLOCKED, T.FAILED, T.CANCELLED}),
    T.MERGING: frozenset({T.DONE, T.REVIEW, T.WORKING, T.FAILED, T.CANCELLED}),
    T.RATE_LIMITED: frozenset({T.READY, T.WORKING, T.CANCELLED}),
    T.BLOCKED: frozenset({T.PENDING, T.READY, T.WORKING, T.REVIEW, T.CANCELLED}),
    T.FAILED: frozenset({T.WORKING, T.CANCELLED}),
    T.DONE: frozenset(),
    T.CANCELLED: frozenset(),
}

#: The agent state machine (containerd's created -> running -> stopped, plus ``waiting`` for
#: a human and ``stopping`` while a stop is in flight).
AGENT_TRANSITIONS: Mapping[AgentStatus, frozenset[AgentStatus]] = {
    A.STARTING: frozenset({A.RUNNING, A.WAITING, A.STOPPING, A.EXITED}),
    A.RUNNING: frozenset({A.WAITING, A.STOPPING, A.EXITED}),
    A.WAITING: frozenset({A.RUNNING, A.STOPPING, A.EXITED}),
    A.STOPPING: frozenset({A.EXITED}),
    A.EXITED: frozenset(),
}

#: The statuses a task may be born in: ``ready`` (its dependencies done), ``pending`` (not
#: yet) or ``blocked`` (one of them failed or was cancelled).
TASK_FIRST = frozenset({T.READY, T.PENDING, T.BLOCKED})
#: An agent is born ``starting``: recorded as the intent before its process runs.
AGENT_FIRST = A.STARTING

STOPPED = "stopped"
STARTED = "started"
#: The session state machine, by ``SessionState.started``.
SESSION_TRANSITIONS: Mapping[str, frozenset[str]] = {
    STOPPED: frozenset({STARTED}),
    STARTED: frozenset({STOPPED}),
}
#: The session's fields that only ``start_session`` and ``stop_session`` write.
_SESSION_PHASE_FIELDS = frozenset({"started", "started_at", "stop_reason", "stopped_at"})


class IllegalTransition(Conflict):
    """A move the table does not allow: a bug, reported and never persisted."""

    code = "illegal_transition"


def task_can_move(current: TaskStatus, target: TaskStatus) -> bool:
    """PURE: may a task in ``current`` move to ``target``?"""
    return current == target or target in TASK_TRANSITIONS[current]


def agent_can_move(current: AgentStatus, target: AgentStatus) -> bool:
    """PURE: may an agent in ``current`` move to ``target``?"""
    return current == target or target in AGENT_TRANSITIONS[current]


@dataclass(frozen=True)
class Move:
    """One task's move for ``move_tasks``: the target status, why, and other fields."""

    status: TaskStatus
    reason: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)


# -- the moves ---------------------------------------------------------------------------------


def _report(state: GridState, kind: str, ident: str, current: str, target: str, why: str) -> None:
    log.error(
        "BUG: illegal %s transition %s: %s -> %s (%s); not persisted",
        kind,
        ident,
        current,
        target,
        why,
    )
    state.bus.publish(
        "lifecycle.illegal_transition",
        {"kind": kind, "id": ident, "from": current, "to": target, "reason": why},
    )


def _illegal(kind: str, ident: str, current: str, target: str) -> IllegalTransition:
    return IllegalTransition(
        f"{kind} {ident!r} cannot move from {current} to {target}",
        details={"kind": kind, "id": ident, "from": current, "to": target},
    )


def _task_changes(task: Task, move: Move, now: Any) -> dict[str, Any]:
    changes: dict[str, Any] = {**move.fields, "status": move.status, "updated_at": now}
    if move.status != task.status:
        changes["status_changed_at"] = now
        changes["status_reason"] = move.reason
    elif move.reason is not None:
        changes["status_reason"] = move.reason
    return changes


def move_task(
    state: GridState,
    task_id: str,
    status: TaskStatus,
    *,
    reason: str | None = None,
    **fields: Any,
) -> Task:
    """Move one task to ``status`` (with ``fields``), or report and refuse the move."""
    task = state.tasks[task_id]
    if not task_can_move(task.status, status):
        _report(state, "task", task_id, task.status.value, status.value, reason or "")
        raise _illegal("task", task_id, task.status.value, status.value)
    move = Move(status, reason, fields)
    updated = validated_task(task, _task_changes(task, move, utcnow()))
    state.write_tasks([updated])
    return updated


def move_tasks(state: GridState, moves: Mapping[str, Move]) -> list[Task]:
    """Move many tasks in one transaction. Illegal moves are reported and left out; the
    legal ones are applied. Returns the tasks that moved."""
    now = utcnow()
    new: list[Task] = []
    for task_id, move in moves.items():
        task = state.tasks[task_id]
        if not task_can_move(task.status, move.status):
            _report(state, "task", task_id, task.status.value, move.status.value, move.reason or "")
            continue
        new.append(validated_task(task, _task_changes(task, move, now)))
    if new:
        state.write_tasks(new)
    return new


def move_agent(
    state: GridState,
    agent_id: str,
    status: AgentStatus,
    *,
    reason: str | None = None,
    **fields: Any,
) -> Agent:
    """Move one agent to ``status`` (with ``fields``), or report and refuse the move."""
    agent = state.agents[agent_id]
    if not agent_can_move(agent.status, status):
        _report(state, "agent", agent_id, agent.status.value, status.value, reason or "")
        raise _illegal("agent", agent_id, agent.status.value, status.value)
    changes: dict[str, Any] = {**fields, "status": status}
    if status != agent.status or reason is not None:
        changes["status_reason"] = reason
    updated = validated_agent(agent, changes)
    state.write_agent(updated)
    return updated


# -- creation ----------------------------------------------------------------------------------


def first_statuses(tasks: list[Task], statuses: Mapping[str, TaskStatus]) -> list[Task]:
    """PURE: new ``tasks``, each in its first status as its dependencies stand in
    ``statuses`` (every task's status, the new ones' included: a big batch is readied a
    chunk at a time against one mapping)."""
    return [t.model_copy(update={"status": readiness(t, statuses) or t.status}) for t in tasks]


def _check_born(state: GridState, tasks: list[Task]) -> None:
    for task in tasks:
        if task.status not in TASK_FIRST:
            _report(state, "task", task.id, "(new)", task.status.value, "created")
            raise _illegal("task", task.id, "(new)", task.status.value)


def create_tasks(state: GridState, tasks: list[Task]) -> list[Task]:
    """Record new tasks (from ``first_statuses``), in one transaction."""
    _check_born(state, tasks)
    return state.add_tasks(tasks)


async def create_tasks_yielding(
    state: GridState, tasks: list[Task], *, pace: BulkPace | None = None
) -> list[Task]:
    """``create_tasks`` for a batch of any size, without holding the event loop
    (``GridState.add_tasks_yielding``, a chunk per turn of ``pace``)."""
    _check_born(state, tasks)
    return await state.add_tasks_yielding(tasks, pace=pace)


def create_agent(state: GridState, agent: Agent) -> Agent:
    """Record a new agent, ``starting``: the intent, found by a restart if the daemon dies
    before its process runs."""
    if agent.status != AGENT_FIRST or agent.id in state.agents:
        current = state.agents[agent.id].status.value if agent.id in state.agents else "(new)"
        _report(state, "agent", agent.id, current, agent.status.value, "created")
        raise _illegal("agent", agent.id, current, agent.status.value)
    return state.put_agent(agent)


# -- the session -------------------------------------------------------------------------------


def session_phase(session: SessionState) -> str:
    return STARTED if session.started else STOPPED


def start_session(
    state: GridState, *, feature_branch: str | None, max_agents: int, budget_usd: float | None
) -> SessionState:
    """Start a new session (stopped -> started): what the last one spent, its branch and its
    stop are forgotten."""
    current = session_phase(state.session)
    if STARTED not in SESSION_TRANSITIONS[current]:
        _report(state, "session", "session", current, STARTED, "started again")
        raise _illegal("session", "session", current, STARTED)
    session = SessionState(
        started=True,
        feature_branch=feature_branch,
        max_agents=max_agents,
        started_at=utcnow(),
        budget_usd=budget_usd,
    )
    state.set_session(session)
    return session


def stop_session(state: GridState, reason: str) -> SessionState:
    """Stop the session (started -> stopped; a stopped one keeps the newer reason)."""
    session = state.session.model_copy(
        update={"started": False, "stop_reason": reason, "stopped_at": utcnow()}
    )
    state.set_session(session)
    return session


def update_session(state: GridState, **fields: Any) -> SessionState:
    """Change the session's other fields (its limits, branch, spending), never whether it
    runs: that is ``start_session``'s and ``stop_session``'s."""
    if _SESSION_PHASE_FIELDS & fields.keys():
        raise StatusBypass(
            "the session is started and stopped only through gridd.lifecycle"
            " (start_session, stop_session)",
            details={"fields": sorted(fields)},
        )
    session = validated_session(state.session, fields)
    state.set_session(session)
    return session


# -- stop intents -------------------------------------------------------------------------------


def intend_stop(state: GridState, agent_id: str, intent: str, reason: str) -> Agent | None:
    """Record that an agent should stop (``"stop"``) or be killed (``"kill"``). The
    scheduler carries it out, after a restart too. A kill outranks a stop; an exited agent
    needs nothing."""
    agent = state.agents[agent_id]
    if agent.status == AgentStatus.EXITED:
        return None
    if agent.intent == "kill" or agent.intent == intent:
        return agent
    updated = state.update_agent(agent_id, intent=intent, stop_reason=reason)
    state.touch()
    return updated
