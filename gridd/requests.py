"""Request bodies of the API (validated with pydantic; unknown fields are refused)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from gridd.ids import branch_problem, task_id_problem


def _check_dependency_ids(value: list[str]) -> list[str]:
    for dep in value:
        if problem := task_id_problem(dep):
            raise ValueError(f"invalid dependency id {dep!r}: {problem}")
    return list(dict.fromkeys(value))


class RequestModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class TaskSpec(RequestModel):
    id: str | None = Field(None, description="generated from the title when omitted")
    title: str = Field(min_length=1, max_length=500)
    prompt: str = Field("", max_length=1_000_000)
    priority: int = Field(2, ge=0, le=4, description="0 is highest, as in beads")
    depends_on: list[str] = Field(default_factory=list, max_length=1000)
    labels: list[str] = Field(default_factory=list, max_length=100)
    agent: str | None = Field(None, max_length=100, description="agent profile name")
    max_attempts: int | None = Field(None, ge=1, le=100)
    max_sessions: int | None = Field(None, ge=1, le=1000, description="agent sessions per task")
    timeout_seconds: float | None = Field(None, gt=0, le=7 * 24 * 3600)
    files: list[str] = Field(
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
    title: str | None = Field(None, min_length=1, max_length=500)
    prompt: str | None = Field(None, max_length=1_000_000)
    priority: int | None = Field(None, ge=0, le=4)
    depends_on: list[str] | None = Field(None, max_length=1000)
    labels: list[str] | None = Field(None, max_length=100)
    agent: str | None = Field(None, max_length=100)
    max_attempts: int | None = Field(None, ge=1, le=100)
    timeout_seconds: float | None = Field(None, gt=0, le=7 * 24 * 3600)

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
    feedback: str = Field(min_length=1, max_length=100_000)


class Respond(RequestModel):
    response: str = Field(max_length=100_000)


def normalise_plan(data: Any) -> Any:
    """Accept a bare list of tasks, and ``depends_on``/``after`` spellings, in plan files."""
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
