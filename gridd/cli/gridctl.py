"""``gridctl``: the command-line client of one workspace's gridd.

Every subcommand is a ``Command`` in ``COMMANDS``: a help line, a function that adds its
flags to its subparser, and a function that runs it with a ``Context`` (the workspace, the
parsed arguments, and a client that starts the daemon on first use unless ``--no-start``).
Adding a subcommand means writing those two functions and one ``COMMANDS`` entry.

Exit codes: 0 ok, 1 error (any GriddError, printed as ``gridctl: <message> [<code>]``),
2 usage, 3 daemon not reachable. Expected errors never print a traceback.
This module talks to gridd only through its socket; it never imports the daemon side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from rich.console import Console

from gridd import __version__
from gridd.cli import daemonctl, render
from gridd.client import GridClient, SSEEvent
from gridd.errors import DaemonUnreachable, GriddError
from gridd.workspace import Workspace, find_workspace

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
#: Event types that describe the stream rather than the workspace; shown only on request.
STREAM_EVENTS = frozenset({"state.snapshot", "reset"})
#: ``events`` keeps reconnecting a broken stream for this long before giving up.
RECONNECT_TIMEOUT = 10.0
RECONNECT_INTERVAL = 0.2


class Context:
    """One invocation: parsed arguments, the workspace, and a lazily started client."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._client: GridClient | None = None

    @cached_property
    def workspace(self) -> Workspace:
        ws = find_workspace(self.args.workspace)
        ws.check_socket_path()
        return ws

    def note(self, message: str) -> None:
        print(f"gridctl: {message}", file=sys.stderr, flush=True)

    def client(self) -> GridClient:
        """A client of a running gridd, starting it first unless ``--no-start``."""
        if self._client is None:
            ws = self.workspace
            if not self.args.no_start:
                status, ours = daemonctl.start(ws)  # a no-op when it already answers
                if ours:
                    self.note(f"started gridd for {ws.root} (pid {status.pid})")
            elif daemonctl.probe(ws) is None:
                raise DaemonUnreachable(
                    f"gridd is not running for {ws.root}; start it with"
                    " 'gridctl daemon start' (or drop --no-start)",
                    details={"socket": str(ws.socket_path)},
                )
            self._client = GridClient(ws.socket_path)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def abandon(self) -> None:
        """Forget the client without closing it (after Ctrl-C its pool may be mid-request)."""
        self._client = None


@dataclass(frozen=True)
class Command:
    """A subcommand: its help, how to add its flags, and how to run it."""

    help: str
    build: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Context], int]
    description: str | None = None


# -- status -------------------------------------------------------------------------------


def build_status(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the raw GET /state document as JSON"
    )


def run_status(ctx: Context) -> int:
    state = ctx.client().get("/state")
    if ctx.args.json:
        print(json.dumps(state, indent=2))
    else:
        Console(highlight=False).print(render.status_view(render.parse_state(state)))
    return EXIT_OK


# -- events -------------------------------------------------------------------------------


def _event_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an event id: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("event ids are >= 0")
    return value


def build_events(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        type=_event_id,
        default=0,
        metavar="N",
        help="print events with an id greater than N (default: 0, the whole retained log)",
    )
    parser.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing new events until Ctrl-C, reconnecting if the daemon restarts",
    )
    parser.add_argument(
        "--types",
        metavar="A,B",
        default=None,
        help="only these comma-separated event types (state.snapshot and reset are shown"
        " only when named here)",
    )
    parser.add_argument(
        "--pretty",
        action="store_true",
        help="human-readable lines '#id type key=value ...' instead of compact JSON",
    )


def stream_events(
    client: GridClient,
    *,
    since: int,
    types: frozenset[str] | None,
    stop_at: int | None,
) -> Iterator[SSEEvent]:
    """Events after ``since``, resuming after broken streams; ends once ``stop_at`` is seen.

    A ``reset`` (the resume point was pruned, or is ahead of the log) is yielded too: after
    a pruned gap we resume from the oldest retained event, otherwise from the daemon's latest.
    """
    last = since
    failing_since: float | None = None
    while True:
        began = time.monotonic()
        healthy = resume_now = False
        try:
            # GridClient.events is a generator; closing it ends the HTTP stream promptly.
            stream = cast(
                Generator[SSEEvent, None, None],
                client.events(since=last, types=sorted(types) if types else None),
            )
            with contextlib.closing(stream):
                for event in stream:
                    healthy = True
                    if event.type == "reset":
                        yield event
                        data = event.data if isinstance(event.data, dict) else {}
                        oldest = int(data.get("oldestRetained", 0))
                        if int(data.get("requested", last)) < oldest - 1:
                            last, resume_now = oldest - 1, True
                            break
                        last = event.id if event.id is not None else last
                        continue
                    if event.id is not None:
                        last = max(last, event.id)
                    yield event
                    if stop_at is not None and last >= stop_at:
                        return
        except DaemonUnreachable:
            pass
        if resume_now:
            continue
        # The stream ended (daemon restarting) or could not be opened: retry for a while,
        # counting from the first failure after a stream that worked.
        now = time.monotonic()
        if healthy or now - began >= 1.0 or failing_since is None:
            failing_since = now
        elif now - failing_since > RECONNECT_TIMEOUT:
            raise DaemonUnreachable(
                f"lost the event stream and could not reconnect for {RECONNECT_TIMEOUT:g} s"
                f" (last event #{last}); resume with 'gridctl events --since {last}'",
                details={"lastEventId": last},
            )
        time.sleep(RECONNECT_INTERVAL)


def _reset_note(data: Any) -> str:
    data = data if isinstance(data, dict) else {}
    requested, oldest = data.get("requested"), data.get("oldestRetained")
    latest = data.get("latest")
    if isinstance(requested, int) and isinstance(oldest, int) and requested < oldest - 1:
        return (
            f"events #{requested + 1}..#{oldest - 1} were pruned from the log;"
            f" continuing from #{oldest}"
        )
    return f"event #{requested} is not in the daemon's log (latest #{latest}); continuing live"


def run_events(ctx: Context) -> int:
    args = ctx.args
    wanted = frozenset(t.strip() for t in (args.types or "").split(",") if t.strip()) or None
    client = ctx.client()
    stop_at: int | None = None
    if not args.follow:
        stop_at = int(client.get("/state")["daemon"]["lastEventId"])
        if args.since >= stop_at:
            return EXIT_OK
    fmt = render.event_pretty if args.pretty else render.event_json
    # Without --follow we filter here: the stop condition needs to see every id.
    server_types = wanted if args.follow else None
    try:
        for event in stream_events(client, since=args.since, types=server_types, stop_at=stop_at):
            shown = event.type in wanted if wanted else event.type not in STREAM_EVENTS
            if shown:
                print(fmt(event), flush=bool(args.follow))
            if event.type == "reset":
                ctx.note(_reset_note(event.data))
    except KeyboardInterrupt:
        ctx.abandon()
    return EXIT_OK


# -- daemon ---------------------------------------------------------------------------------


def build_daemon(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="daemon_action", metavar="ACTION", required=True)
    for name, help_text in daemonctl.ACTIONS.items():
        add_global_options(actions.add_parser(name, help=help_text, description=help_text))


def run_daemon(ctx: Context) -> int:
    return daemonctl.run_action(ctx.workspace, ctx.args.daemon_action)


COMMANDS: dict[str, Command] = {
    "status": Command(
        help="summary of the session, tasks, agents and questions",
        description="Show the workspace's session, task counts, agents, pending questions and"
        " the daemon's version, pid, uptime and last event id.",
        build=build_status,
        run=run_status,
    ),
    "events": Command(
        help="print the event log (one JSON object per line), optionally following it",
        description="Print events from the daemon's durable log as compact JSON lines"
        ' {"id", "type", "data"}. Without --follow, print the events that exist now and exit.',
        build=build_events,
        run=run_events,
    ),
    "daemon": Command(
        help="start, stop, restart or check the workspace daemon",
        description="Manage the gridd process of this workspace. 'start' runs it detached;"
        " its startup output goes to .grid/gridd.out and its log to .grid/gridd.log.",
        build=build_daemon,
        run=run_daemon,
    ),
}


# -- parser and entry point -----------------------------------------------------------------


def add_global_options(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """The options every command accepts, before or after the subcommand name."""
    # On subparsers the default is SUPPRESS, so an option given before the subcommand is
    # not overwritten by the subparser's default.
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--workspace",
        type=Path,
        default=default,
        metavar="PATH",
        help="a path inside the git repository to act on (default: the current directory)",
    )
    parser.add_argument(
        "--no-start",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="do not start gridd when it is not running; fail with exit status 3 instead",
    )
    parser.add_argument("--version", action="version", version=f"gridctl {__version__}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gridctl",
        description="Control the gridd daemon of a git workspace. Commands that need the daemon"
        " start it when it is not running (unless --no-start).",
        epilog="exit status: 0 ok, 1 error, 2 usage error, 3 daemon not reachable",
    )
    add_global_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        sub = commands.add_parser(
            name, help=command.help, description=command.description or command.help
        )
        command.build(sub)
        add_global_options(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ctx = Context(args)
    try:
        return COMMANDS[args.command].run(ctx)
    except DaemonUnreachable as exc:
        print(f"gridctl: {exc.message} [{exc.code}]", file=sys.stderr)
        return EXIT_UNREACHABLE
    except GriddError as exc:
        print(f"gridctl: {exc.message} [{exc.code}]", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        ctx.abandon()
        return 130
    except BrokenPipeError:
        # The reader went away (``gridctl events | head``); that is not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
