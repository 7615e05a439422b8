"""The ``gridctl status`` screen (the daemon, the session, task counts, the merge train,
conflicts, agents and questions) and its one-line summary for a log or a pipe."""

from __future__ import annotations

from datetime import datetime

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gridd.cli.render import (
    ago,
    clip,
    duration,
    money,
    resume_text,
    waited,
)
from gridd.cli.render_agents import agents_table
from gridd.cli.render_questions import questions_table
from gridd.model import (
    AgentStatus,
    ConflictItem,
    RepoState,
    SessionState,
    TaskStatus,
)


def _daemon_line(state: RepoState) -> Text:
    d = state.daemon
    return Text.assemble(
        ("gridd ", "bold"),
        (d.version, "bold"),
        f"  pid {d.pid}  up {duration(d.uptime)}  last event #{d.last_event_id}\n",
        ("workspace ", "dim"),
        d.workspace,
    )


def budget_text(session: SessionState, spent: float) -> str:
    """``$3.20 of $50.00``, or ``$3.20 (no budget cap)`` for an explicitly unlimited session."""
    if session.budget_usd is None:
        return f"{money(spent)} (no budget cap)"
    return f"{money(spent)} of {money(session.budget_usd)}"


#: What each persisted stop reason means, for people.
STOP_REASONS = {
    "user": "stopped by a person",
    "budget_exhausted": "the budget is spent",
    "no_work": "no work was left for agents",
    "stop_file": "a STOP file asked for it",
    "error": "an error",
}


def _session_line(state: RepoState, *, now: datetime | None = None) -> Text:
    s = state.session
    spent = budget_text(s, state.stats.spent_usd)
    if not s.started:
        if s.stop_reason is None and s.stopped_at is None:
            return Text.assemble(("session ", "dim"), "not started")
        reason = s.stop_reason or "unknown"
        meaning = STOP_REASONS.get(reason)
        when = f" {ago(s.stopped_at, now=now)}" if s.stopped_at else ""
        waiting = state.stats.review
        review = f"; {waiting} in review wait for you (gridctl task approve)" if waiting else ""
        return Text.assemble(
            ("session ", "dim"),
            ("stopped", "bold"),
            f" ({reason}{': ' + meaning if meaning else ''}{review}){when}  spent {spent}",
        )
    since = f", since {s.started_at:%Y-%m-%d %H:%M:%S}" if s.started_at else ""
    return Text.assemble(
        ("session ", "dim"),
        (s.feature_branch or "(no branch)", "bold green"),
        f"  max {s.max_agents} agents{since}  spent {spent}",
    )


def _task_counts(state: RepoState) -> RenderableType:
    counts = state.stats.model_dump()
    present = [s.value for s in TaskStatus if counts.get(s.value, 0)]
    if not present:
        return Text(f"tasks ({len(state.tasks)}): none", style="dim")
    table = Table(title=f"tasks ({len(state.tasks)})", title_justify="left", box=None)
    for status in present:  # the statuses some task is in: ten columns do not fit 80
        table.add_column(status, justify="right")
    table.add_row(*(str(counts.get(status, 0)) for status in present))
    return table


def _merged_line(state: RepoState) -> Text | None:
    """Done tasks per feature branch they were merged into, the session's branch first."""
    merged = state.stats.merged_by_branch
    if not merged:
        return None
    current = state.session.feature_branch
    order = sorted(merged, key=lambda branch: (branch != current, branch))
    parts = [f"{merged[b]} into {b}{' (this session)' if b == current else ''}" for b in order]
    return Text.assemble(("merged: ", "dim"), ", ".join(parts))


def train_line(state: RepoState, *, now: datetime | None = None) -> Text | None:
    """The merge train's candidate under way: its phase and the tasks riding in it."""
    train = state.merge_train
    if train is None:
        return None
    phase = train.phase
    if phase == "gating" and train.gate_started_at is not None:
        phase = f"gating for {waited(train.gate_started_at, now=now)}"
    what = [phase]
    if train.bisecting:
        what.append("bisecting a failed batch")
    if train.retry:
        what.append("a last suspect, gated alone once more")
    if len(train.candidates) > 1:  # [merge] gate_concurrency: each on the one ahead
        what.append(f"{len(train.candidates)} candidates gated at once")
    elif train.candidate:
        what.append(f"candidate {train.candidate[:12]}")
    groups = [c.tasks for c in train.candidates] or [train.tasks]  # " | " between candidates
    riding = clip(" | ".join(", ".join(group) for group in groups), 200)
    return Text.assemble(
        ("merge train: ", "dim"),
        f"{len(train.tasks)} task(s) ride ({'; '.join(what)}): {riding}",
    )


def _task_notes(state: RepoState, *, now: datetime | None = None) -> Text | None:
    """Who waits: tasks waiting for an answer, and rate-limited ones with when they resume."""
    notes = []
    if state.stats.waiting:
        n = state.stats.waiting
        notes.append(f"{n} task{'s' if n != 1 else ''} waiting for an answer")
    parked = [t for t in state.tasks if t.status == TaskStatus.RATE_LIMITED]
    if parked or state.stats.rate_limited:
        n = max(len(parked), state.stats.rate_limited)
        times = [t.resume_at for t in parked if t.resume_at is not None]
        when = f", the first resumes at {resume_text(min(times), now=now)}" if times else ""
        notes.append(f"{n} rate limited{when}")
    return Text("; ".join(notes), style="yellow") if notes else None


def conflict_lines(items: list[ConflictItem]) -> list[Text]:
    """One line per conflict radar finding (``gridctl status`` and ``gridctl conflicts``)."""
    lines = []
    for item in items:
        who = " + ".join(item.tasks)
        if item.kind == "feature":
            who += " + the feature branch"
        files = ", ".join(item.files[:5]) + (" ..." if len(item.files) > 5 else "")
        if item.predicted_conflict:
            lines.append(
                Text.assemble(
                    ("conflict predicted: ", "bold red"),
                    f"{who} in {', '.join(item.conflict_files[:5])}",
                )
            )
        else:
            lines.append(Text.assemble(("overlap: ", "yellow"), f"{who} both change {files}"))
    return lines


def status_view(state: RepoState, *, now: datetime | None = None) -> RenderableType:
    """The whole ``gridctl status`` screen."""
    parts: list[RenderableType] = [
        _daemon_line(state),
        _session_line(state, now=now),
        Text(""),
        _task_counts(state),
    ]
    merged = _merged_line(state)
    if merged is not None:
        parts.append(merged)
    train = train_line(state, now=now)
    if train is not None:
        parts.append(train)
    notes = _task_notes(state, now=now)
    if notes is not None:
        parts.append(notes)
    parts += conflict_lines(state.conflicts)
    parts += [
        Text(""),
        agents_table(state.agents, now=now, titled=True),
        questions_table(state.pending_questions, now=now, titled=True),
    ]
    for warning in state.daemon.warnings:
        parts.append(Text.assemble(("warning: ", "bold yellow"), warning))
    return Group(*parts)


def summary_line(state: RepoState) -> str:
    """One line for a log or a pipe: the session, live agents, the task counts, the open
    questions and the money spent."""
    s = state.session
    session = f"session {s.feature_branch or '(no branch)'}" if s.started else "no session"
    if not s.started and s.stop_reason:
        session += f" (stopped: {s.stop_reason})"
    live = sum(1 for a in state.agents if a.status != AgentStatus.EXITED)
    counts = state.stats.model_dump()
    tasks = " ".join(f"{status.value} {counts.get(status.value, 0)}" for status in TaskStatus)
    asked = len(state.pending_questions)
    return (
        f"{session}, {live} agent{'s' if live != 1 else ''}; tasks: {tasks};"
        f" {asked} question{'s' if asked != 1 else ''} waiting; spent"
        f" {budget_text(s, state.stats.spent_usd)}"
    )
