"""How ``gridctl`` shows agents: the agents table, an agent's status, its sandbox and
where it runs."""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import datetime

from rich.console import RenderableType
from rich.text import Text

from gridd.cli.render import (
    FittedTable,
    clip,
    duration,
    money,
    plain_texts,
    waited,
)
from gridd.model import (
    Agent,
    AgentStatus,
    utcnow,
)


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
        cells = plain_texts(
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
