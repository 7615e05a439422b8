"""Request specs: the bodies of the API, validated with pydantic (unknown fields are refused).

Text that can reach git (a title becomes a commit message, labels and profile names end up
in argv and files) may not hold control characters; a prompt may hold newlines and tabs but
no other control character. Numbers must be finite. In a patch, ``null`` clears a field
that may be empty (``agent``, ``timeoutSeconds``) and is refused for any other.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from gridd.ids import branch_problem, task_id_problem

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_WHITESPACE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _no_control(value: str) -> str:
    if match := _CONTROL.search(value):
        raise ValueError(f"must not contain control characters (found {match.group()!r})")
    return value


def _text(value: str) -> str:
    if match := _CONTROL_BUT_WHITESPACE.search(value):
        raise ValueError(
            f"must not contain control characters other than newline and tab"
            f" (found {match.group()!r})"
        )
    return value


#: One line of text: no control characters at all.
Line = Annotated[str, AfterValidator(_no_control)]
#: Free text: newlines and tabs allowed, other control characters not.
Text = Annotated[str, AfterValidator(_text)]


def _check_dependency_ids(value: list[str]) -> list[str]:
    for dep in value:
        if problem := task_id_problem(dep):
            raise ValueError(f"invalid dependency id {dep!r}: {problem}")
    return list(dict.fromkeys(value))


class RequestModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        allow_inf_nan=False,
        defer_build=True,
    )


class TaskSpec(RequestModel):
    id: str | None = Field(None, description="generated from the title when omitted")
    title: Line = Field(min_length=1, max_length=500)
    prompt: Text = Field("", max_length=1_000_000)
    priority: int = Field(2, ge=0, le=4, description="0 is highest, as in beads")
    depends_on: list[str] = Field(default_factory=list, max_length=1000)
    labels: list[Line] = Field(default_factory=list, max_length=100)
    agent: Line | None = Field(None, max_length=100, description="agent profile name")
    max_attempts: int | None = Field(None, ge=1, le=100)
    max_sessions: int | None = Field(None, ge=1, le=1000, description="agent sessions per task")
    timeout_seconds: float | None = Field(None, gt=0, le=7 * 24 * 3600)
    files: list[Line] = Field(
        default_factory=list,
        max_length=1000,
        description="paths the task expects to change (the conflict radar's hold policy)",
    )

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str | None) -> str | None:
        if value is not None and (problem := task_id_problem(value)):
            raise ValueError(f"invalid task id {value!r}: {problem}")
        return value

    @field_validator("depends_on")
    @classmethod
    def _valid_deps(cls, value: list[str]) -> list[str]:
        return _check_dependency_ids(value)


class TaskPatch(RequestModel):
    """Fields to change; absent fields stay. ``null`` clears ``agent`` (back to the default
    profile) and ``timeoutSeconds`` (no timeout) and is a 422 for the others."""

    title: Line | None = Field(None, min_length=1, max_length=500)
    prompt: Text | None = Field(None, max_length=1_000_000)
    priority: int | None = Field(None, ge=0, le=4)
    depends_on: list[str] | None = Field(None, max_length=1000)
    labels: list[Line] | None = Field(None, max_length=100)
    agent: Line | None = Field(None, max_length=100)
    max_attempts: int | None = Field(None, ge=1, le=100)
    timeout_seconds: float | None = Field(None, gt=0, le=7 * 24 * 3600)

    @field_validator(
        "title", "prompt", "priority", "depends_on", "labels", "max_attempts", mode="before"
    )
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("may not be null (omit the field to leave it unchanged)")
        return value

    @field_validator("depends_on")
    @classmethod
    def _valid_deps(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _check_dependency_ids(value)


class PlanSpec(RequestModel):
    tasks: list[TaskSpec] = Field(min_length=1, max_length=50_000)


class SessionStart(RequestModel):
    feature_branch: str | None = Field(
        None, max_length=200, description="the branch every approved task is merged into"
    )
    base_branch: str | None = Field(
        None,
        max_length=200,
        description="where a new feature branch starts (default: the main worktree's branch)",
    )
    max_agents: int | None = Field(None, ge=1, le=256)
    budget_usd: float | None = Field(None, ge=0)
    on_conflict: Literal["agent", "human", "fail"] | None = Field(
        None, description="a conflicting or failing merge: default [merge] on_conflict"
    )

    @field_validator("feature_branch", "base_branch")
    @classmethod
    def _valid_branch(cls, value: str | None) -> str | None:
        if value is not None and (problem := branch_problem(value)):
            raise ValueError(f"invalid branch name {value!r}: {problem}")
        return value


class Reject(RequestModel):
    feedback: Text = Field(min_length=1, max_length=100_000)


class Approve(RequestModel):
    accept_markers: list[Annotated[Line, Field(min_length=1, max_length=4096)]] = Field(
        default_factory=list,
        max_length=1000,
        description="paths (globs) whose conflict-marker-like lines the merge may keep;"
        " recorded in the task.merge_queued event",
    )


class Respond(RequestModel):
    response: str = Field(max_length=100_000)


def normalise_plan(data: Any) -> Any:
    """Accept a bare list of tasks, and the ``depends_on``/``after``/``deps`` spellings of
    ``dependsOn`` (one id without a list, too), in plan files."""
    if isinstance(data, list):
        data = {"tasks": data}
    if isinstance(data, dict) and isinstance(data.get("tasks"), list):
        tasks = []
        for item in data["tasks"]:
            if isinstance(item, dict):
                item = dict(item)
                for alias in ("depends_on", "after", "deps"):
                    if alias in item and "dependsOn" not in item:
                        item["dependsOn"] = item.pop(alias)
                if isinstance(item.get("dependsOn"), str):
                    item["dependsOn"] = [item["dependsOn"]]
            tasks.append(item)
        data = {**data, "tasks": tasks}
    return data
