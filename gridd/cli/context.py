"""What every ``gridctl`` subcommand is built from: ``Command``, ``Context`` and exit codes.

A ``Command`` is a help line, a function adding its flags to its subparser and a function
running it with a ``Context`` (the parsed arguments, the workspace, and a client that starts
the daemon on first use unless ``--no-start``). ``group`` makes a command of named actions
(``gridctl task add``). The subcommand modules import this one, and ``gridctl`` imports them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from gridd import __version__
from gridd.cli import daemonctl
from gridd.client import GridClient
from gridd.errors import DaemonUnreachable, NotFound
from gridd.ids import validate_task_id
from gridd.spelling import closest
from gridd.workspace import Workspace, find_workspace

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


class Context:
    """One invocation: parsed arguments, the workspace, and a lazily started client."""

    def __init__(self, args: argparse.Namespace, *, parser: argparse.ArgumentParser) -> None:
        self.args = args
        #: The whole command tree these arguments were parsed by (``gridctl completion``
        #: reads it), so no command imports the entry point that lists it.
        self.parser = parser
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


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that answers an unknown option where it was given: the usage
    of the (sub)command it was given to and the closest option that command has
    (``unknown option --priorty; did you mean --priority?``), not the top-level usage and
    "unrecognized arguments". Subparsers are made of the same class (argparse's default)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        # A subcommand's parser has already answered what it was given, so what is left
        # here was given to this parser.
        if extras:
            self.error(self._unknown(extras))
        return parsed, extras

    def _unknown(self, extras: list[str]) -> str:
        known = [opt for action in self._actions for opt in action.option_strings]
        options = [arg for arg in extras if arg.startswith("-") and arg != "-"]
        if not options:
            return f"unrecognized arguments: {' '.join(extras)}"
        names = [option.split("=", 1)[0] for option in options]
        hints = {name: closest(name, known) for name in names}
        if len(names) == 1:
            name, hint = names[0], hints[names[0]]
            text = f"unknown option {name}" + (f"; did you mean {hint}?" if hint else "")
        else:
            text = "unknown options " + ", ".join(
                name + (f" (did you mean {hints[name]}?)" if hints[name] else "") for name in names
            )
        return text if any(hints.values()) else f"{text} (see {self.prog} --help)"


@dataclass(frozen=True)
class Command:
    """A subcommand: its help, how to add its flags, and how to run it."""

    help: str
    build: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Context], int]
    description: str | None = None


def segment(value: str, *, kind: Literal["task", "agent", "question"]) -> str:
    """``value`` (a ``kind`` id a person typed) as one URL path segment, so that the daemon
    answers about that id, never "no such endpoint".

    Percent-encoding carries '?', '#', ' ' and '%'. It cannot carry what the path is made of:
    the daemon's HTTP server decodes '%2F' before it routes, so a '/' would split the id,
    and an empty id matches no route. No id of any kind holds either, so such a value is
    refused here, in the words the daemon uses for an id it does not know. '.' and '..' are
    sent as '%2E' and '%2E%2E': URL normalisation would drop them with the segment before.
    """
    if "/" in value or not value:
        if kind == "task":
            validate_task_id(value)  # raises: no task id holds a '/' or is empty
        raise NotFound(f"no {kind} {value[:80]!r}", code=f"{kind}_not_found", details={"id": value})
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


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


def add_commands(
    parser: argparse.ArgumentParser,
    commands: dict[str, Command],
    *,
    dest: str,
    metavar: str,
) -> None:
    """One subparser per command; the chosen command's ``run`` lands in ``args.<dest>_run``.
    A command listed under a second name is that name's alias (``task``, ``tasks``)."""
    sub = parser.add_subparsers(dest=dest, metavar=metavar, required=True)
    names: dict[int, list[str]] = {}
    for name, command in commands.items():
        names.setdefault(id(command), []).append(name)
    for name, *aliases in names.values():
        command = commands[name]
        child = sub.add_parser(
            name,
            aliases=aliases,
            help=command.help,
            description=command.description or command.help,
        )
        command.build(child)
        add_global_options(child)
        child.set_defaults(**{f"{dest}_run": command.run})


def group(help: str, actions: dict[str, Command], *, description: str | None = None) -> Command:
    """A command made of named actions, each a ``Command`` of its own."""

    def build(parser: argparse.ArgumentParser) -> None:
        add_commands(parser, actions, dest="action", metavar="ACTION")

    def run(ctx: Context) -> int:
        action: Callable[[Context], int] = ctx.args.action_run
        return action(ctx)

    return Command(help=help, build=build, run=run, description=description)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value
