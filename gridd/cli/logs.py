"""``gridctl logs``: an agent's output, printed raw, and followed live until the agent exits
(with what its sandbox refused it, on stderr).

The stored output (``GET /agents/{id}/output``) and the live ``agent.output`` events carry
the same per-agent ``seq``, consecutive from 1. Following takes the event log position
first, then prints what is stored, then reads events from that position: anything written
after the position is an event, anything before it is stored, so nothing is lost, and a
chunk is printed only when its ``seq`` is past the last one printed, so nothing is doubled.
A gap in ``seq`` (or a ``reset`` of the stream) is filled from the stored output.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from gridd.cli.context import EXIT_OK, Command, Context, non_negative_int, segment
from gridd.cli.events_cmd import stream_events
from gridd.client import GridClient
from gridd.errors import GriddError, NotFound, ValidationFailed
from gridd.model import Agent, AgentStatus

#: Events that end an agent; ``logs --follow`` stops at the first one for its agent.
EXIT_EVENTS = frozenset({"agent.completed", "agent.failed", "agent.stopped"})
PAGE_SIZE = 1000
#: What its sandbox refused the agent; ``logs --follow`` says it on stderr as it comes.
DENIED = "agent.sandbox_denied"


class OutputPrinter:
    """Writes one agent's chunks to stdout in ``seq`` order, each exactly once."""

    def __init__(self, client: GridClient, agent_id: str, *, after: int) -> None:
        self.client = client
        self.agent_id = agent_id
        self.last = after
        self._out = sys.stdout.buffer

    def catch_up(self) -> None:
        """Print every stored chunk after the last one printed."""
        path = f"/agents/{segment(self.agent_id, kind='agent')}/output"
        while True:
            page = self.client.get(path, params={"since": self.last, "limit": PAGE_SIZE})
            chunks = page.get("chunks") or []
            for chunk in chunks:
                self._write(int(chunk["seq"]), str(chunk["chunk"]))
            if not chunks or not page.get("more"):
                return

    def live(self, seq: int, text: str) -> None:
        """A chunk from an ``agent.output`` event."""
        if seq > self.last + 1:
            self.catch_up()  # the chunks in between are stored: print them first
        self._write(seq, text)

    def _write(self, seq: int, text: str) -> None:
        if seq <= self.last:
            return
        self._out.write(text.encode("utf-8", errors="replace"))
        self._out.flush()
        self.last = seq


def _agent(data: Any) -> Agent:
    try:
        return Agent.model_validate(data)
    except ValidationError as exc:
        raise GriddError(
            f"the daemon sent an agent this gridctl does not understand: {exc.errors()[0]['msg']}",
            code="bad_response",
        ) from None


def resolve(client: GridClient, target: str) -> Agent | None:
    """The agent named ``target``, else the newest agent of task ``target``, else None.

    Raises NotFound when ``target`` is neither an agent nor a task.
    """
    try:
        return _agent(client.get(f"/agents/{segment(target, kind='agent')}"))
    except NotFound:
        pass
    mine = [
        a for a in map(_agent, client.get("/agents", params={"all": "1"})) if a.task_id == target
    ]
    if mine:
        return max(mine, key=lambda a: (a.started_at, a.attempt))
    try:
        client.get(f"/tasks/{segment(target, kind='task')}")
    except (NotFound, ValidationFailed):
        raise NotFound(
            f"no agent or task {target!r} (see 'gridctl agents --all' and 'gridctl task list')",
            code="not_found",
            details={"id": target},
        ) from None
    return None


def _wait_for_spawn(client: GridClient, task_id: str, *, since: int) -> tuple[str, int]:
    """``(agent id, event id)`` of the next ``agent.spawned`` for ``task_id`` after ``since``."""
    for event in stream_events(
        client, since=since, types=frozenset({"agent.spawned"}), stop_at=None
    ):
        data = event.data if isinstance(event.data, dict) else {}
        if event.type == "agent.spawned" and data.get("taskId") == task_id:
            return str(data["agentId"]), event.id if event.id is not None else since
        if event.type == "reset":
            agent = resolve(client, task_id)  # it may have spawned in the part we lost
            if agent is not None:
                return agent.id, event.id if event.id is not None else since
    raise AssertionError("stream_events ends only by raising")  # pragma: no cover


def _follow(ctx: Context, printer: OutputPrinter, *, since: int) -> None:
    types = frozenset({"agent.output", DENIED, *EXIT_EVENTS})
    for event in stream_events(printer.client, since=since, types=types, stop_at=None):
        data = event.data if isinstance(event.data, dict) else {}
        if event.type == "reset":
            printer.catch_up()
        elif data.get("agentId") != printer.agent_id:
            continue
        elif event.type == "agent.output":
            printer.live(int(data["seq"]), str(data.get("chunk", "")))
        elif event.type == DENIED:
            held = int(data.get("unreported") or 0)
            more = f" ({held} more refused before, unreported)" if held else ""
            ctx.note(f"sandbox refused {data.get('kind')} {data.get('target')}{more}")
        elif event.type in EXIT_EVENTS:
            printer.catch_up()
            ctx.note(f"agent {printer.agent_id} exited ({event.type.removeprefix('agent.')})")
            return


def build_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="AGENT_OR_TASK",
        help="an agent id, or a task id (its most recently started agent)",
    )
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing new output until the agent exits (or Ctrl-C); for a task whose"
        " agent has not started yet, wait for it",
    )
    parser.add_argument(
        "--since",
        type=non_negative_int,
        default=0,
        metavar="SEQ",
        help="print only chunks after sequence number SEQ (default 0: all of it)",
    )


def run_logs(ctx: Context) -> int:
    client = ctx.client()
    target, follow = ctx.args.target, ctx.args.follow
    # The position comes first: what happens after it arrives as events, the rest is stored.
    mark = int(client.get("/state")["daemon"]["lastEventId"]) if follow else 0
    agent = resolve(client, target)
    if agent is None and not follow:
        raise GriddError(
            f"task {target!r} has no agent yet (use --follow to wait for one)", code="no_agent"
        )
    try:
        if agent is None:
            ctx.note(f"waiting for an agent to start on task {target}")
            agent_id, mark = _wait_for_spawn(client, target, since=mark)
            running = True
        else:
            agent_id, running = agent.id, agent.status != AgentStatus.EXITED
        printer = OutputPrinter(client, agent_id, after=ctx.args.since)
        printer.catch_up()
        if follow and running:
            _follow(ctx, printer, since=mark)
    except KeyboardInterrupt:
        ctx.abandon()
    return EXIT_OK


LOGS = Command(
    help="print an agent's output (by agent or task id), optionally following it",
    description="Print the output of an agent exactly as it wrote it (stdout and stderr, in"
    " order), with no decoration. Given a task id, the task's most recently started agent."
    " With --follow, keep printing until the agent exits.",
    build=build_logs,
    run=run_logs,
)
