"""How ``gridctl`` shows things to people: status, agents, questions, money, time, events.

Pure formatting: every function takes wire data (already fetched) and returns text or rich
renderables, so it can be tested without a daemon and reused by later subcommands. Tasks
and waves have their own module, ``render_tasks``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from gridd.client import SSEEvent
from gridd.errors import GriddError
from gridd.model import (
    Agent,
    AgentStatus,
    ConflictItem,
    Question,
    QuestionStatus,
    RepoState,
    SessionState,
    TaskStatus,
    utcnow,
)

_ELLIPSIS = "…"
_Model = TypeVar("_Model", bound=BaseModel)


def console() -> Console:
    """The console a command prints to. On a terminal, rich's; anywhere else nothing is
    wrapped or cut at a width (a log or a script reads whole lines), and tables are
    tab-separated (``FittedTable``)."""
    out = Console(highlight=False)
    if not out.is_terminal:
        out.soft_wrap = True
    return out


def parse_wire(model: type[_Model], data: Any, *, what: str | None = None) -> _Model:
    """Validate one wire document; a malformed answer is a GriddError, not a traceback."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        noun = model.__name__.lower()
        name = what or f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"
        raise GriddError(
            f"the daemon sent {name} this gridctl does not understand: {exc.errors()[0]['msg']}",
            code="bad_response",
        ) from None


def parse_state(data: Any) -> RepoState:
    """Validate ``GET /state``."""
    return parse_wire(RepoState, data, what="a /state")


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


def ago(when: datetime, *, now: datetime | None = None) -> str:
    """``2m 5s ago`` (a clock a little ahead of ours reads as ``0s ago``)."""
    seconds = ((now or utcnow()) - when).total_seconds()
    return f"{duration(max(seconds, 0.0))} ago"


def brief(seconds: float) -> str:
    """Two units at most, for "how long has it waited": ``45s``, ``3m``, ``2h 5m``, ``1d 3h``."""
    total = max(int(seconds), 0)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m"
    if total < 86400:
        hours, minutes = divmod(total // 60, 60)
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(total // 3600, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def waited(since: datetime, *, now: datetime | None = None) -> str:
    """How long since ``since``, briefly (a clock a little ahead of ours reads as ``0s``)."""
    return brief(((now or utcnow()) - since).total_seconds())


def money(usd: float | None) -> str:
    """``3.2`` -> ``$3.20``; fractions of a cent keep their digits; None -> ``-``."""
    if usd is None:
        return "-"
    if 0 < abs(usd) < 0.01:
        return f"${usd:.4f}"
    return f"${usd:,.2f}"


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


def resume_text(when: datetime, *, now: datetime | None = None) -> str:
    """When a parked task resumes: ``14:05:00 (in 12m)`` in local time."""
    left = (when - (now or utcnow())).total_seconds()
    local = when.astimezone()
    stamp = f"{local:%H:%M:%S}" if left < 20 * 3600 else f"{local:%Y-%m-%d %H:%M}"
    return f"{stamp} (in {brief(left)})" if left > 0 else f"{stamp} (due)"


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


def agent_status(agent: Agent, *, now: datetime | None = None) -> Text:
    text = agent.status.value
    if agent.exit_code is not None:
        text += f" ({agent.exit_code})"
    style = ""
    if agent.status == AgentStatus.WAITING:
        style = "bold magenta"
        if agent.waiting_since is not None:
            text += f" {waited(agent.waiting_since, now=now)}"
    if agent.stalled:
        text, style = f"{text}, stalled", "bold red"
    return Text(text, style=style)


def _activity(agent: Agent) -> str:
    if agent.current_tool and agent.status != "exited":
        return clip(f"using {agent.current_tool}", 50)
    parts = [part for part in (agent.activity, agent.message) if part]
    return clip(": ".join(parts), 50) if parts else "-"


def sandbox_text(agent: Agent) -> str:
    """The run's sandbox: its mode and what it may write (its worktree and ``TMPDIR`` by
    those names, the home directory as ``~``), and the hosts it may reach when its network
    is restricted; ``off`` when it has none."""
    box = agent.sandbox
    if not box:
        return "off"
    names = {
        os.path.realpath(agent.worktree_path): "worktree",
        os.path.realpath(os.path.join(agent.run_dir, "tmp")): "TMPDIR",
    }
    home = os.path.expanduser("~")
    shown = []
    for path in box.get("writable", []):
        if path in names:
            shown.append(names[path])
        elif home != "/" and (path == home or path.startswith(home + "/")):
            shown.append("~" + path[len(home) :])
        else:
            shown.append(path)
    text = f"{box.get('mode', '?')}: {', '.join(shown)}" if shown else str(box.get("mode"))
    network = box.get("network", "allow")
    if network == "allowlist":
        return f"{text}; network: {', '.join(box.get('allowHosts') or []) or 'nothing'}"
    return f"{text}; network: none" if network == "none" else text


def _spend(agent: Agent) -> str:
    """Cost, and the tokens when the agent reports them ("$0.42, 12.3k tokens")."""
    tokens = (agent.input_tokens or 0) + (agent.output_tokens or 0)
    if not tokens:
        return money(agent.cost_usd)
    shown = f"{tokens / 1000:.1f}k" if tokens >= 1000 else str(tokens)
    return f"{money(agent.cost_usd)}, {shown} tokens"


def plain_cell(text: str) -> str:
    """A cell of a tab-separated line: tabs and line breaks become spaces."""
    return " ".join(text.replace("\t", " ").splitlines()) if text else ""


class FittedTable:
    """A table laid out for where it is printed.

    On a terminal, when its columns do not all fit, those in ``give_way`` are left out, in
    that order, until the rest do; the columns kept show their cells whole, except those
    in ``wrapped`` (name -> width), which wrap there. When even those do not fit, each row
    becomes a block of ``column  value`` lines instead of a row of words wrapped one per line.

    Anywhere else (a pipe, a file, a CI log) it is plain text: a header line of the column
    names, then one line per row, the cells separated by tabs, every column, no title and
    no decoration (``gridctl task list | cut -f1``). With ``titled`` (a table inside a larger
    view, ``gridctl status``) the title, or ``empty``, comes first."""

    def __init__(
        self,
        title: str,
        columns: Sequence[str],
        rows: Sequence[Mapping[str, Text]],
        *,
        give_way: Sequence[str],
        wrapped: Mapping[str, int] | None = None,
        right: Sequence[str] = (),
        empty: str = "",
        titled: bool = False,
    ) -> None:
        self.title, self.names, self.rows = title, list(columns), rows
        self.give_way, self.wrapped, self.right = give_way, dict(wrapped or {}), set(right)
        self.empty, self.titled = empty, titled
        self._widths: dict[str, int] = {}

    def width_of(self, name: str) -> int:
        """The column's widest cell (or its wrap width), measured once per table: the
        layout asks for each column's width once per column that gives way, and a live
        view renders the same table again at every refresh."""
        if name not in self._widths:
            widest = max([len(name), *(row[name].cell_len for row in self.rows)])
            self._widths[name] = min(widest, self.wrapped.get(name, widest))
        return self._widths[name]

    def _needed(self, names: Sequence[str]) -> int:
        # Each column takes its widest cell, a space either side and one border.
        return sum(self.width_of(n) + 3 for n in names) + 1

    def columns(self, max_width: int) -> list[str]:
        """The columns shown in ``max_width`` cells: all, or all but those that gave way."""
        shown = list(self.names)
        for name in self.give_way:
            if self._needed(shown) <= max_width:
                break
            shown.remove(name)
        return shown

    def plain_lines(self) -> list[str]:
        """The tab-separated form: the header, then one line per row."""
        lines = ["\t".join(self.names)]
        lines += [
            "\t".join(plain_cell(row[name].plain) for name in self.names) for row in self.rows
        ]
        return lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not options.is_terminal:
            if self.titled:
                yield Text(self.title if self.rows else self.empty)
            if self.rows or not self.titled:
                # Segments, not Text: a line is never wrapped at the console's width.
                for line in self.plain_lines():
                    yield Segment(line)
                    yield Segment.line()
            return
        if not self.rows:
            yield Text(self.empty, style="dim")
            return
        shown = self.columns(options.max_width)
        if self._needed(shown) > options.max_width:
            yield from self._blocks()
            return
        table = Table(title=self.title, title_justify="left")
        for name in shown:
            wraps = name in self.wrapped
            table.add_column(
                name,
                no_wrap=not wraps,
                min_width=len(name) if wraps else self.width_of(name),
                justify="right" if name in self.right else "left",
            )
        for row in self.rows:
            table.add_row(*(row[name] for name in shown))
        yield table

    def _blocks(self) -> RenderResult:
        """One block per row, every column: for a width no table fits in."""
        yield Text(self.title, style="italic")
        for row in self.rows:
            block = Table.grid(padding=(0, 2))
            block.add_column(style="bold", no_wrap=True)
            block.add_column()
            for name in self.names:
                block.add_row(name, row[name])
            yield Text("")
            yield block


def agents_table(
    agents: Iterable[Agent],
    *,
    empty: str = "no agents",
    now: datetime | None = None,
    titled: bool = False,
) -> RenderableType:
    """Agents, one row each: id, task (and session), profile, status (exit code, how long it
    has waited, stalled), pid, age, cost (and tokens), activity (the tool in use, if any) and
    last output."""
    agents = list(agents)
    columns: tuple[str, ...] = (
        "agent",
        "task",
        "profile",
        "status",
        "pid",
        "running for",
        "cost",
        "activity",
    )
    boxed = any(a.sandbox for a in agents)  # the column only where a sandbox is in use
    if boxed:
        columns += ("sandbox",)
    remote = any(a.executor for a in agents)  # the column only where a run is in a box
    runs_in: tuple[str, ...] = ("runs in",) if remote else ()
    columns += runs_in
    rows = []
    for a in agents:
        elapsed = ((a.ended_at or now or utcnow()) - a.started_at).total_seconds()
        task = a.task_id if a.session_number <= 1 else f"{a.task_id} (session {a.session_number})"
        cells = _plain(
            str(a.pid) if a.pid is not None else "-",
            duration(max(elapsed, 0.0)),
            _spend(a),
            _activity(a),
            clip(a.last_output, 60),
        )
        if boxed:
            cells.insert(-1, Text(sandbox_text(a)))
        if remote:
            cells.insert(-1, Text(_runs_in(a)))
        rows.append(
            dict(
                zip(
                    (*columns, "last output"),
                    (Text(a.id), Text(task), Text(a.profile), agent_status(a, now=now), *cells),
                    strict=True,
                )
            )
        )
    return FittedTable(
        f"agents ({len(agents)})",
        (*columns, "last output"),
        rows,
        give_way=(*runs_in, "pid", "cost", "profile", "running for", "activity"),
        wrapped={"activity": 24, "last output": 40, "sandbox": 30},
        empty=empty,
        titled=titled,
    )


def _runs_in(agent: Agent) -> str:
    """Where the run executes: "local", or the engine and its box (docs/executors.md)."""
    where = agent.executor
    if not where:
        return "local"
    shown = f"{where.get('kind', '?')} {where.get('box', '')}".strip()
    if where.get("pod"):
        shown += f" pod {where['pod']}"
    return shown + (f" on {where['node']}" if where.get("node") else "")


def _question_wait(question: Question, *, now: datetime | None = None) -> str:
    if question.status == QuestionStatus.PENDING:
        return f"waiting {waited(question.asked_at, now=now)}"
    if question.answered_at is not None:
        return f"answered after {brief((question.answered_at - question.asked_at).total_seconds())}"
    return f"asked {ago(question.asked_at, now=now)}"


def _question_status(question: Question) -> str:
    if question.status == QuestionStatus.ANSWERED:
        return f"answered: {clip(question.answer or '', 40)}"
    if question.status == QuestionStatus.CLOSED:
        return f"closed: {question.closed_reason or 'no reason given'}"
    return question.status.value


def questions_table(
    questions: Iterable[Question],
    *,
    empty: str = "no pending questions",
    title: str = "pending questions",
    now: datetime | None = None,
    titled: bool = False,
) -> RenderableType:
    """Questions, one row each: id, agent, task, type, question, options, how long it waited
    (and, when any is no longer pending, its status and answer)."""
    rows = list(questions)
    settled = any(q.status != QuestionStatus.PENDING for q in rows)
    names = ["question id", "agent", "task", "type", "question", "options", "waited"]
    if settled:
        names.append("status")
    cells = []
    for q in rows:
        values = [
            q.id,
            q.agent_id,
            q.task_id,
            q.type,
            clip(q.question, 200),
            " / ".join(q.options) or "-",
            _question_wait(q, now=now),
        ]
        if settled:
            values.append(_question_status(q))
        cells.append(dict(zip(names, _plain(*values), strict=True)))
    return FittedTable(
        f"{title} ({len(rows)})",
        names,
        cells,
        give_way=("type", "waited"),
        wrapped={"question": 40, "options": 24, "status": 30},
        empty=empty,
        titled=titled,
    )


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
