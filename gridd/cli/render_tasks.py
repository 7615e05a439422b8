"""How ``gridctl`` shows tasks: the task table, one task in detail, and plan waves.

Pure formatting over wire models, like ``render`` (whose time and money helpers it uses);
an agent's status as ``render_agents`` shows it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gridd.cli.render import (
    FittedTable,
    ago,
    duration,
    money,
    resume_text,
    waited,
)
from gridd.cli.render_agents import agent_status
from gridd.model import Agent, Task, TaskStatus

STATUS_STYLES = {
    TaskStatus.PENDING: "dim",
    TaskStatus.READY: "cyan",
    TaskStatus.WORKING: "bold yellow",
    TaskStatus.REVIEW: "bold magenta",
    TaskStatus.MERGING: "magenta",
    TaskStatus.DONE: "green",
    TaskStatus.FAILED: "bold red",
    TaskStatus.BLOCKED: "red",
    TaskStatus.CANCELLED: "dim",
    TaskStatus.RATE_LIMITED: "yellow",
}


def _status(status: TaskStatus) -> Text:
    return Text(status.value, style=STATUS_STYLES.get(status, ""))


def task_status(task: Task, *, now: datetime | None = None) -> Text:
    """Its status, with how long its agent has waited for an answer or when it resumes."""
    text = _status(task.status)
    if task.waiting_since is not None and task.status == TaskStatus.WORKING:
        text.append(f", waiting {waited(task.waiting_since, now=now)}", style="bold magenta")
    if task.status == TaskStatus.RATE_LIMITED and task.resume_at is not None:
        text.append(f" until {resume_text(task.resume_at, now=now)}")
    return text


#: The task table's columns, and the order they give way in when the terminal is too narrow
#: for all of them (``branch`` first: it is ``grid/<id>``). The id always shows whole: it
#: is what every other command takes.
TASK_COLUMNS = ("id", "status", "pri", "deps", "agent", "attempts", "sessions", "cost", "branch")


def _task_row(t: Task, now: datetime | None) -> dict[str, Text]:
    return {
        "id": Text(t.id),
        "status": task_status(t, now=now),
        "pri": Text(str(t.priority)),
        "deps": Text(", ".join(t.depends_on) or "-"),
        "agent": Text(t.agent or "(default)", style="" if t.agent else "dim"),
        "attempts": Text(f"{t.attempts}/{t.max_attempts}"),
        "sessions": Text(f"{t.sessions}/{t.max_sessions}"),
        "cost": Text(money(t.cost_usd)),
        "branch": Text(t.branch or "-"),
        "updated": Text(ago(t.updated_at, now=now)),
    }


def task_table(tasks: Sequence[Task], *, now: datetime | None = None) -> RenderableType:
    """``gridctl task list``: one row per task, fitted to the terminal's width (or
    tab-separated, when not printed on a terminal)."""
    return FittedTable(
        f"tasks ({len(tasks)})",
        (*TASK_COLUMNS, "updated"),
        [_task_row(t, now) for t in tasks],
        give_way=("branch", "sessions", "cost", "updated", "agent"),
        wrapped={"deps": 24},
        right=("pri",),
        empty="no tasks",
    )


#: Fields ``task_detail`` lays out by hand; any other field of ``Task`` is listed after them.
_SHOWN_TASK_FIELDS = frozenset(
    {
        "id", "title", "prompt", "status", "priority", "depends_on", "labels", "agent",
        "attempts", "max_attempts", "timeout_seconds", "source", "branch", "worktree",
        "created_at", "updated_at", "error", "changed_files", "sessions", "max_sessions",
        "cost_usd", "waiting_since", "resume_at", "summary",
    }
)  # fmt: skip


def _field_text(value: Any) -> str:
    if value is None or value == []:
        return "-"
    if isinstance(value, datetime):
        return f"{value:%Y-%m-%d %H:%M:%S} ({ago(value)})"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


def task_detail(task: Task, agents: Sequence[Agent] = ()) -> RenderableType:
    """``gridctl task show``: every field, its changed files, its error and its agents."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()

    def row(name: str, value: str | Text) -> None:
        grid.add_row(name, value if isinstance(value, Text) else Text(value))

    row("id", task.id)
    row("title", task.title)
    row("status", task_status(task))
    row("priority", str(task.priority))
    row("depends on", ", ".join(task.depends_on) or "-")
    row("labels", ", ".join(task.labels) or "-")
    row("agent", task.agent or "(default profile)")
    row("attempts", f"{task.attempts} of {task.max_attempts}")
    row("sessions", f"{task.sessions} of {task.max_sessions}")
    row("cost", money(task.cost_usd))
    row("timeout", duration(task.timeout_seconds) if task.timeout_seconds else "-")
    row("source", task.source)
    row("branch", task.branch or "-")
    row("worktree", task.worktree or "-")
    row("created", f"{task.created_at:%Y-%m-%d %H:%M:%S} ({ago(task.created_at)})")
    row("updated", f"{task.updated_at:%Y-%m-%d %H:%M:%S} ({ago(task.updated_at)})")
    if task.waiting_since is not None:
        row("waiting since", _field_text(task.waiting_since))
    if task.resume_at is not None:
        row("resumes at", resume_text(task.resume_at))
    if task.summary:
        row("summary", task.summary)
    if task.error:
        row("error", Text(task.error, style="bold red"))
    files = "\n".join(task.changed_files) if task.changed_files else "-"
    row(f"changed files ({len(task.changed_files)})", files)
    for name in type(task).model_fields:
        if name not in _SHOWN_TASK_FIELDS:
            row(name.replace("_", " "), _field_text(getattr(task, name)))
    for agent in sorted(agents, key=lambda a: a.started_at):
        line = agent_status(agent)
        line.append(f", attempt {agent.attempt}, session {agent.session_number}, started")
        line.append(f" {ago(agent.started_at)}")
        if agent.cost_usd is not None:
            line.append(f", cost {money(agent.cost_usd)}")
        if agent.error:
            line.append(f": {agent.error}")
        row(f"agent {agent.id}", line)
    parts: list[RenderableType] = [grid]
    if task.prompt:
        parts += [Text(""), Text("prompt", style="bold"), Text(task.prompt)]
    return Group(*parts)


def waves_text(
    waves: Sequence[Sequence[str]],
    *,
    statuses: Mapping[str, str] | None = None,
    titles: Mapping[str, str] | None = None,
) -> str:
    """Waves in order, one task per line: ``wave 1`` then ``  id  status  title``."""
    if not waves:
        return "no tasks"
    statuses, titles = statuses or {}, titles or {}
    every = [task_id for wave in waves for task_id in wave]
    id_width = max(len(task_id) for task_id in every)
    status_width = max((len(statuses.get(task_id, "")) for task_id in every), default=0)
    lines = []
    for number, wave in enumerate(waves, start=1):
        lines.append(f"wave {number} ({len(wave)} task{'s' if len(wave) != 1 else ''})")
        for task_id in wave:
            cells = [task_id.ljust(id_width)]
            if status_width:
                cells.append(statuses.get(task_id, "").ljust(status_width))
            cells.append(" ".join(titles.get(task_id, "").split()))
            lines.append("  " + "  ".join(cells).rstrip())
    return "\n".join(lines)
