"""How ``gridctl`` shows things to people: status, tasks, waves, agents and event lines.

Pure formatting: every function takes wire data (already fetched) and returns text or rich
renderables, so it can be tested without a daemon and reused by later subcommands.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gridd.client import SSEEvent
from gridd.errors import GriddError
from gridd.model import Agent, AgentStatus, Question, RepoState, Task, TaskStatus, utcnow

_ELLIPSIS = "…"


def parse_state(data: Any) -> RepoState:
    """Validate ``GET /state``; a malformed answer is a GriddError, not a traceback."""
    try:
        return RepoState.model_validate(data)
    except ValidationError as exc:
        raise GriddError(
            f"the daemon sent a /state this gridctl does not understand: {exc.errors()[0]['msg']}",
            code="bad_response",
        ) from None


def duration(seconds: float) -> str:
    """``3725.2`` -> ``1h 2m 5s``."""
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{days}d" if days else "",
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
    ]
    return " ".join(p for p in [*parts, f"{secs}s"] if p)


def clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + _ELLIPSIS


def _plain(*cells: str) -> list[Text]:
    # Agent output and questions may contain "[...]": never let rich read them as markup.
    return [Text(cell) for cell in cells]


def _daemon_line(state: RepoState) -> Text:
    d = state.daemon
    return Text.assemble(
        ("gridd ", "bold"),
        (d.version, "bold"),
        f"  pid {d.pid}  up {duration(d.uptime)}  last event #{d.last_event_id}\n",
        ("workspace ", "dim"),
        d.workspace,
    )


def _session_line(state: RepoState) -> Text:
    s = state.session
    if not s.started:
        return Text.assemble(("session ", "dim"), "not started")
    since = f", since {s.started_at:%Y-%m-%d %H:%M:%S}" if s.started_at else ""
    return Text.assemble(
        ("session ", "dim"),
        (s.feature_branch or "(no branch)", "bold green"),
        f"  max {s.max_agents} agents{since}",
    )


def _task_counts(state: RepoState) -> RenderableType:
    counts = state.stats.model_dump()
    table = Table(title=f"tasks ({len(state.tasks)})", title_justify="left", box=None)
    for status in TaskStatus:
        table.add_column(status.value, justify="right")
    table.add_row(*(str(counts.get(status.value, 0)) for status in TaskStatus))
    return table


def agents_table(agents: Iterable[Agent], *, empty: str = "no agents") -> RenderableType:
    """Agents, one row each: id, task, profile, status (exit code), pid, age, last output."""
    rows = list(agents)
    if not rows:
        return Text(empty, style="dim")
    table = Table(title=f"agents ({len(rows)})", title_justify="left")
    for name in ("agent", "task", "profile", "status", "pid", "running for", "last output"):
        table.add_column(name, no_wrap=name != "last output")
    for a in rows:
        elapsed = ((a.ended_at or utcnow()) - a.started_at).total_seconds()
        table.add_row(
            *_plain(
                a.id,
                a.task_id,
                a.profile,
                a.status.value if a.exit_code is None else f"{a.status.value} ({a.exit_code})",
                str(a.pid) if a.pid is not None else "-",
                duration(max(elapsed, 0.0)),
                clip(a.last_output, 60),
            )
        )
    return table


def _questions(questions: Iterable[Question]) -> RenderableType:
    rows = list(questions)
    if not rows:
        return Text("no pending questions", style="dim")
    table = Table(title=f"pending questions ({len(rows)})", title_justify="left")
    for name in ("question id", "agent", "task", "question"):
        table.add_column(name, no_wrap=name != "question")
    for q in rows:
        options = f"  [{' / '.join(q.options)}]" if q.options else ""
        table.add_row(*_plain(q.id, q.agent_id, q.task_id, clip(q.question, 200) + options))
    return table


def status_view(state: RepoState) -> RenderableType:
    """The whole ``gridctl status`` screen."""
    parts: list[RenderableType] = [
        _daemon_line(state),
        _session_line(state),
        Text(""),
        _task_counts(state),
        Text(""),
        agents_table(state.agents),
        _questions(state.pending_questions),
    ]
    for warning in state.daemon.warnings:
        parts.append(Text.assemble(("warning: ", "bold yellow"), warning))
    return Group(*parts)


def event_json(event: SSEEvent) -> str:
    """One event as compact JSON: ``{"id":..,"type":..,"data":..}``."""
    return json.dumps(event.as_dict(), separators=(",", ":"), default=str)


def _value(value: Any) -> str:
    if isinstance(value, str):
        return (
            value
            if value and not any(c.isspace() or c in "\"'=" for c in value)
            else json.dumps(value)
        )
    return json.dumps(value, separators=(",", ":"), default=str)


def event_pretty(event: SSEEvent) -> str:
    """One event for people: ``#12 agent.spawned agentId=a1 taskId=t1``."""
    head = f"#{event.id if event.id is not None else '-'} {event.type}"
    if isinstance(event.data, dict):
        pairs = " ".join(f"{key}={_value(value)}" for key, value in event.data.items())
    else:
        pairs = _value(event.data)
    return f"{head} {pairs}".rstrip()


# -- tasks, waves and the watch line ---------------------------------------------------------

STATUS_STYLES = {
    TaskStatus.PENDING: "dim",
    TaskStatus.READY: "cyan",
    TaskStatus.WORKING: "bold yellow",
    TaskStatus.REVIEW: "bold magenta",
    TaskStatus.DONE: "green",
    TaskStatus.FAILED: "bold red",
    TaskStatus.BLOCKED: "red",
    TaskStatus.CANCELLED: "dim",
}


def ago(when: datetime, *, now: datetime | None = None) -> str:
    """``2m 5s ago`` (a clock a little ahead of ours reads as ``0s ago``)."""
    seconds = ((now or utcnow()) - when).total_seconds()
    return f"{duration(max(seconds, 0.0))} ago"


def _status(status: TaskStatus) -> Text:
    return Text(status.value, style=STATUS_STYLES.get(status, ""))


def task_table(tasks: Sequence[Task], *, now: datetime | None = None) -> RenderableType:
    """``gridctl task list``: one row per task."""
    if not tasks:
        return Text("no tasks", style="dim")
    table = Table(title=f"tasks ({len(tasks)})", title_justify="left")
    for name in ("id", "status", "pri", "deps", "agent", "attempts", "branch", "updated"):
        table.add_column(
            name,
            no_wrap=name != "deps",
            min_width=len(name),
            justify="right" if name == "pri" else "left",
        )
    for t in tasks:
        table.add_row(
            Text(t.id),
            _status(t.status),
            Text(str(t.priority)),
            Text(", ".join(t.depends_on) or "-"),
            Text(t.agent or "(default)", style="" if t.agent else "dim"),
            Text(f"{t.attempts}/{t.max_attempts}"),
            Text(t.branch or "-"),
            Text(ago(t.updated_at, now=now)),
        )
    return table


#: Fields ``task_detail`` lays out by hand; any other field of ``Task`` is listed after them.
_SHOWN_TASK_FIELDS = frozenset(
    {
        "id", "title", "prompt", "status", "priority", "depends_on", "labels", "agent",
        "attempts", "max_attempts", "timeout_seconds", "source", "branch", "worktree",
        "created_at", "updated_at", "error", "changed_files",
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
    row("status", _status(task.status))
    row("priority", str(task.priority))
    row("depends on", ", ".join(task.depends_on) or "-")
    row("labels", ", ".join(task.labels) or "-")
    row("agent", task.agent or "(default profile)")
    row("attempts", f"{task.attempts} of {task.max_attempts}")
    row("timeout", duration(task.timeout_seconds) if task.timeout_seconds else "-")
    row("source", task.source)
    row("branch", task.branch or "-")
    row("worktree", task.worktree or "-")
    row("created", f"{task.created_at:%Y-%m-%d %H:%M:%S} ({ago(task.created_at)})")
    row("updated", f"{task.updated_at:%Y-%m-%d %H:%M:%S} ({ago(task.updated_at)})")
    if task.error:
        row("error", Text(task.error, style="bold red"))
    files = "\n".join(task.changed_files) if task.changed_files else "-"
    row(f"changed files ({len(task.changed_files)})", files)
    for name in type(task).model_fields:
        if name not in _SHOWN_TASK_FIELDS:
            row(name.replace("_", " "), _field_text(getattr(task, name)))
    for agent in sorted(agents, key=lambda a: a.started_at):
        code = "" if agent.exit_code is None else f" ({agent.exit_code})"
        row(
            f"agent {agent.id}",
            f"{agent.status.value}{code}, attempt {agent.attempt}, started"
            f" {ago(agent.started_at)}" + (f": {agent.error}" if agent.error else ""),
        )
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


def summary_line(state: RepoState) -> str:
    """One line for a log or a pipe: the session, live agents and the task counts."""
    s = state.session
    session = f"session {s.feature_branch or '(no branch)'}" if s.started else "no session"
    live = sum(1 for a in state.agents if a.status != AgentStatus.EXITED)
    counts = state.stats.model_dump()
    tasks = " ".join(f"{status.value} {counts.get(status.value, 0)}" for status in TaskStatus)
    return f"{session}, {live} agent{'s' if live != 1 else ''}; tasks: {tasks}"
