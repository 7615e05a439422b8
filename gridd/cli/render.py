"""How ``gridctl`` shows things to people: the status summary and event lines.

Pure formatting: every function takes wire data (already fetched) and returns text or rich
renderables, so it can be tested without a daemon and reused by later subcommands.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gridd.client import SSEEvent
from gridd.errors import GriddError
from gridd.model import Agent, Question, RepoState, TaskStatus, utcnow

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


def _agents(agents: Iterable[Agent]) -> RenderableType:
    rows = list(agents)
    if not rows:
        return Text("no agents", style="dim")
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
        _agents(state.agents),
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
