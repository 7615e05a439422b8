"""A validated change to a task, an agent or the session: the model with some fields
replaced, checked by the same pydantic models as the API before anything is written (a 422
otherwise).

Shared by the state machines (``lifecycle``, which changes a status and the session) and
the state cache (``GridState.update_task`` / ``update_agent``, which change the other
fields); it sits
beside the models so that neither has to import the other for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gridd.errors import ValidationFailed
from gridd.model import Agent, SessionState, Task

_TASK_FIELDS = frozenset(Task.model_fields)
_AGENT_FIELDS = frozenset(Agent.model_fields)
_SESSION_FIELDS = frozenset(SessionState.model_fields)


def validated_task(task: Task, changes: Mapping[str, Any]) -> Task:
    """``task`` with ``changes``, validated as the API validates a task (422 otherwise)."""
    unknown = set(changes) - _TASK_FIELDS
    if unknown:
        raise ValidationFailed(
            f"unknown task field(s): {', '.join(sorted(unknown))}",
            code="unknown_field",
            details={"fields": sorted(unknown)},
        )
    try:
        return Task.model_validate({**task.model_dump(), **changes})
    except ValidationError as exc:
        raise ValidationFailed(
            f"invalid change to task {task.id!r}",
            code="invalid_task",
            details={"problems": _problems(exc)},
        ) from None


def validated_agent(agent: Agent, changes: Mapping[str, Any]) -> Agent:
    unknown = set(changes) - _AGENT_FIELDS
    if unknown:
        raise ValidationFailed(
            f"unknown agent field(s): {', '.join(sorted(unknown))}",
            code="unknown_field",
            details={"fields": sorted(unknown)},
        )
    try:
        return Agent.model_validate({**agent.model_dump(), **changes})
    except ValidationError as exc:
        raise ValidationFailed(
            f"invalid change to agent {agent.id!r}",
            code="invalid_agent",
            details={"problems": _problems(exc)},
        ) from None


def validated_session(session: SessionState, changes: Mapping[str, Any]) -> SessionState:
    """The session with ``changes``, validated (422 otherwise)."""
    unknown = set(changes) - _SESSION_FIELDS
    if unknown:
        raise ValidationFailed(
            f"unknown session field(s): {', '.join(sorted(unknown))}",
            code="unknown_field",
            details={"fields": sorted(unknown)},
        )
    try:
        return SessionState.model_validate({**session.model_dump(), **changes})
    except ValidationError as exc:
        raise ValidationFailed(
            "invalid change to the session",
            code="invalid_session",
            details={"problems": _problems(exc)},
        ) from None


def _problems(exc: ValidationError) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]} for e in exc.errors()
    ]
