"""The task and agent state machines: the statuses, one table of legal moves, and the only
code that changes a status.

Modelled on Kubernetes pod phases and containerd task states: few states, explicit
transitions, and the reason stored next to the state (``Task.status_reason``,
``Agent.status_reason``). Every room that wants a task or an agent in another status asks
this module (``move_task``, ``move_tasks``, ``move_agent``); ``GridState.update_task`` and
``update_agent`` refuse a ``status`` of their own. Each move is validated by the same
pydantic models as the API before anything is written.

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

from gridd.changes import validated_agent, validated_task
from gridd.errors import Conflict
from gridd.model import Agent, AgentStatus, Task, TaskStatus, utcnow

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
