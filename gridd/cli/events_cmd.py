"""``gridctl events``: the daemon's event log, printed or followed, resuming broken streams.

``stream_events`` is the one resilient reader of ``GET /events``; ``logs --follow`` and
``status --watch`` use it too.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Generator, Iterator
from typing import Any, cast

from gridd import event_types
from gridd.cli import render_events
from gridd.cli.context import EXIT_OK, Command, Context
from gridd.client import GridClient, SSEEvent
from gridd.errors import DaemonUnreachable

#: Event types that describe the stream rather than the workspace; shown only on request.
STREAM_EVENTS = event_types.STREAM_ONLY
#: ``stream_events`` keeps reconnecting a broken stream for this long before giving up.
RECONNECT_TIMEOUT = 10.0
RECONNECT_INTERVAL = 0.2


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
        help="keep printing new events until Ctrl-C; if the daemon restarts, reconnect and go on"
        f" (after {RECONNECT_TIMEOUT:g} s with no daemon it stops, saying how to resume)",
    )
    parser.add_argument(
        "--types",
        metavar="A,B",
        default=None,
        help="only these comma-separated event types (state.snapshot and reset are shown"
        " only when named here); an unknown type is an error",
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
    if wanted and not args.follow:
        # Filtered here, so the daemon never sees them to refuse a misspelt one (with
        # --follow it does: the daemon's list is the one that counts).
        event_types.refuse_unknown(wanted)
    client = ctx.client()
    stop_at: int | None = None
    if not args.follow:
        stop_at = int(client.get("/state")["daemon"]["lastEventId"])
        if args.since >= stop_at:
            return EXIT_OK
    fmt = render_events.event_pretty if args.pretty else render_events.event_json
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


EVENTS = Command(
    help="print the event log (one JSON object per line), optionally following it",
    description="Print events from the daemon's durable log as compact JSON lines"
    ' {"id", "type", "data"}. Without --follow, print the events that exist now and exit.',
    build=build_events,
    run=run_events,
)
