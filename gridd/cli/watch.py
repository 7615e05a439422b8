"""``gridctl status --watch``: the status screen kept current from the event stream.

A reader thread follows ``GET /events`` and only raises a flag; the main thread re-fetches
``GET /state`` when the flag is up (at most ``MAX_FETCHES_PER_SECOND``) or every
``REFRESH_SECONDS`` anyway, and redraws. On a terminal that is a rich ``Live`` view; into a
pipe or a file it is one summary line per change. ``--until-idle`` ends the watch (exit 0)
once nothing can move without a person (see ``idle``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import datetime

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from gridd.cli import render, render_status, render_tasks
from gridd.cli.context import EXIT_OK, Context
from gridd.cli.events_cmd import RECONNECT_TIMEOUT, stream_events
from gridd.client import GridClient
from gridd.errors import DaemonUnreachable, GriddError
from gridd.model import RepoState, TaskStatus

REFRESH_SECONDS = 2.0
MAX_FETCHES_PER_SECOND = 5
#: The live view lists tasks one by one only up to this many (counts are always shown).
TASK_ROWS = 25


#: Statuses of tasks that move on without anyone's help.
_MOVING = frozenset({TaskStatus.READY, TaskStatus.WORKING, TaskStatus.RATE_LIMITED})


def idle(state: RepoState) -> bool:
    """Nothing moves without a person: no task is ready or working (or parked until a rate
    limit resets), and no pending task is about to become ready (all its dependencies done).

    A pending task whose dependencies wait in review, or failed, waits for a person; counting
    it as busy would make ``--until-idle`` wait forever on a plan of several waves.
    """
    statuses = {t.id: t.status for t in state.tasks}
    for task in state.tasks:
        if task.status in _MOVING:
            return False
        if task.status == TaskStatus.PENDING and all(
            statuses.get(dep) == TaskStatus.DONE for dep in task.depends_on
        ):
            return False
    return True


class _Follower(threading.Thread):
    """Raises ``woke`` for every event; keeps the error that ended the stream, if any."""

    def __init__(self, client: GridClient, *, since: int) -> None:
        super().__init__(name="gridctl-events", daemon=True)
        self.client = client
        self.since = since
        self.woke = threading.Event()
        self.error: GriddError | None = None

    def run(self) -> None:
        try:
            for _ in stream_events(self.client, since=self.since, types=None, stop_at=None):
                self.woke.set()
        except GriddError as exc:
            self.error = exc
            self.woke.set()


class _StateReader:
    """``GET /state``, tolerating a daemon that is briefly away (restarting)."""

    def __init__(self, client: GridClient) -> None:
        self.client = client
        self.failing_since: float | None = None

    def read(self) -> RepoState | None:
        try:
            state = render.parse_state(self.client.get("/state"))
        except DaemonUnreachable:
            now = time.monotonic()
            self.failing_since = self.failing_since or now
            if now - self.failing_since > RECONNECT_TIMEOUT:
                raise
            return None
        self.failing_since = None
        return state


def _view(state: RepoState, *, away: bool, until_idle: bool) -> RenderableType:
    parts: list[RenderableType] = [render_status.status_view(state)]
    if 0 < len(state.tasks) <= TASK_ROWS:
        parts += [Text(""), render_tasks.task_table(state.tasks)]
    if away:
        parts.append(Text("the daemon is not answering; retrying", style="bold yellow"))
    hint = "until nothing can move without you" if until_idle else "Ctrl-C to quit"
    parts.append(Text(f"watching ({hint})", style="dim"))
    return Group(*parts)


def run_watch(ctx: Context, *, until_idle: bool) -> int:
    client = ctx.client()
    reader = _StateReader(client)
    state = render.parse_state(client.get("/state"))
    follower = _Follower(GridClient(client.socket_path), since=state.daemon.last_event_id)
    follower.start()
    console = Console(highlight=False)
    last_line = ""

    def show(live: Live | None, away: bool) -> None:
        nonlocal last_line
        if live is not None:
            live.update(_view(state, away=away, until_idle=until_idle), refresh=True)
            return
        line = render_status.summary_line(state)
        if line != last_line:
            print(f"{datetime.now():%H:%M:%S} {line}", flush=True)
            last_line = line

    try:
        with contextlib.ExitStack() as stack:
            live = None
            if console.is_terminal:
                live = stack.enter_context(Live(console=console, auto_refresh=False))
            show(live, False)
            last_fetch = time.monotonic()
            while not (until_idle and idle(state)):
                follower.woke.wait(REFRESH_SECONDS)
                if follower.error is not None:
                    raise follower.error
                pause = 1 / MAX_FETCHES_PER_SECOND - (time.monotonic() - last_fetch)
                if pause > 0:
                    time.sleep(pause)
                follower.woke.clear()  # before the fetch: what it misses raises it again
                fresh = reader.read()
                last_fetch = time.monotonic()
                state = fresh or state
                show(live, fresh is None)
    except KeyboardInterrupt:
        ctx.abandon()
    return EXIT_OK
