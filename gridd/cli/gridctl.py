"""``gridctl``: the command-line client of one workspace's gridd.

Every subcommand is a ``Command`` in ``COMMANDS`` (see ``gridd.cli.context``): a help line,
a function that adds its flags to its subparser, and a function that runs it with a
``Context``. Commands live by concept: ``tasks_cmd`` (task), ``plan_cmd`` (plan),
``session_cmd`` (session, agents, agent), ``questions_cmd`` (questions, answer, respond),
``logs``, ``events_cmd``, ``watch`` (status --watch), ``metrics_cmd``, ``service_cmd``
(service), ``init``, ``doctor``, ``completion``, ``upgrade`` (daemon upgrade); status and daemon are here. Adding one
means one ``COMMANDS`` entry. ``render`` and ``render_tasks`` format what they print.

Exit codes: 0 ok, 1 error (any GriddError, printed as ``gridctl: <message> [<code>]``, then
each of its ``details.problems``, the ``details.options`` a question offers and a
``details.closedReason``), 2 usage, 3 daemon not reachable. Expected errors never
print a traceback. This module talks to gridd only through its socket; it never imports
the daemon side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gridd.cli import daemonctl, render, render_status, watch
from gridd.cli.completion import COMPLETION
from gridd.cli.context import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Command,
    Context,
    Parser,
    add_commands,
    add_global_options,
)
from gridd.cli.doctor import DOCTOR
from gridd.cli.events_cmd import EVENTS
from gridd.cli.init_cmd import INIT
from gridd.cli.logs import LOGS
from gridd.cli.metrics_cmd import METRICS
from gridd.cli.plan_cmd import PLAN
from gridd.cli.questions_cmd import ANSWER, QUESTIONS, RESPOND
from gridd.cli.service_cmd import SERVICE
from gridd.cli.session_cmd import AGENT, AGENTS, SESSION
from gridd.cli.tasks_cmd import TASK
from gridd.cli.trust_cmd import TRUST
from gridd.errors import DaemonUnreachable, GriddError
from gridd.model import ConflictItem
from gridd.workspace import forget_inherited_git_repository

__all__ = ["COMMANDS", "EXIT_ERROR", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "main"]


# -- status -------------------------------------------------------------------------------


def build_status(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the raw GET /state document as JSON"
    )
    parser.add_argument(
        "--watch",
        "-w",
        action="store_true",
        help="keep the view current from the event stream until Ctrl-C (on a terminal a live"
        " screen, otherwise one summary line per change)",
    )
    parser.add_argument(
        "--until-idle",
        action="store_true",
        help="watch until nothing can move without you, then exit 0 (implies --watch): no"
        " task is ready or working, and every pending task waits on one in review or failed",
    )


def run_status(ctx: Context) -> int:
    args = ctx.args
    if args.watch or args.until_idle:
        if args.json:
            print("gridctl: --json cannot be combined with --watch", file=sys.stderr)
            return EXIT_USAGE
        return watch.run_watch(ctx, until_idle=args.until_idle)
    state = ctx.client().get("/state")
    if args.json:
        print(json.dumps(state, indent=2))
    else:
        render.console().print(render_status.status_view(render.parse_state(state)))
    return EXIT_OK


# -- conflicts ------------------------------------------------------------------------------


def build_conflicts(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print GET /conflicts as JSON")


def run_conflicts(ctx: Context) -> int:
    data = ctx.client().get("/conflicts")
    if ctx.args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    items = [render.parse_wire(ConflictItem, item) for item in data["conflicts"]]
    if not items:
        print("no overlapping work between live tasks")
    console = render.console()
    for line in render_status.conflict_lines(items):
        console.print(line)
    return EXIT_OK


# -- daemon ---------------------------------------------------------------------------------


def build_daemon(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="daemon_action", metavar="ACTION", required=True)
    for name, help_text in daemonctl.ACTIONS.items():
        action = actions.add_parser(name, help=help_text, description=help_text)
        add_global_options(action)
        if name == "stop":
            action.add_argument(
                "--agents",
                action="store_true",
                help="stop the running agents too (they commit their work; tasks go back to"
                " ready), and say how many",
            )


def run_daemon(ctx: Context) -> int:
    if ctx.args.daemon_action == "upgrade":
        from gridd.cli.upgrade import run_upgrade  # a command above daemonctl, loaded when used

        return run_upgrade(ctx.workspace)
    agents = bool(getattr(ctx.args, "agents", False))
    return daemonctl.run_action(ctx.workspace, ctx.args.daemon_action, agents=agents)


COMMANDS: dict[str, Command] = {
    "init": INIT,
    "status": Command(
        help="summary of the session, budget, tasks, agents and questions (--watch: live)",
        description="Show the workspace's session (its budget and what it has spent, or why it"
        " stopped), task counts (with tasks waiting for an answer and rate-limited ones and"
        " when they resume), agents, pending questions with how long they have waited, and"
        " the daemon's version, pid, uptime and last event id. With --watch, keep it current"
        " from the event stream.",
        build=build_status,
        run=run_status,
    ),
    "conflicts": Command(
        help="the conflict radar: live tasks changing the same files, predicted conflicts",
        description="Show which live tasks (working, in review, merging) change the same"
        " files, with each other or with what landed on the feature branch since they"
        " branched, and which of those git merge-tree predicts will conflict.",
        build=build_conflicts,
        run=run_conflicts,
    ),
    "task": TASK,
    "tasks": TASK,  # the same group: 'gridctl tasks diff ID' reads as naturally
    "plan": PLAN,
    "session": SESSION,
    "agents": AGENTS,
    "agent": AGENT,
    "questions": QUESTIONS,
    "answer": ANSWER,
    "respond": RESPOND,
    "logs": LOGS,
    "events": EVENTS,
    "metrics": METRICS,
    "completion": COMPLETION,
    "service": SERVICE,
    "doctor": DOCTOR,
    "trust": TRUST,
    "daemon": Command(
        help="start, stop, restart or check the workspace daemon",
        description="Manage the gridd process of this workspace. 'start' runs it detached;"
        " its startup output goes to .grid/gridd.out and its log to .grid/gridd.log.",
        build=build_daemon,
        run=run_daemon,
    ),
}


# -- parser and entry point -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gridctl",
        description="Control the gridd daemon of a git workspace. Commands that need the daemon"
        " start it when it is not running (unless --no-start).",
        epilog="When standard output is not a terminal, list commands (task list, agents,"
        " questions, status) print tab-separated lines: a header, then one line per record."
        " exit status: 0 ok, 1 error, 2 usage error, 3 daemon not reachable",
    )
    add_global_options(parser, top=True)
    add_commands(parser, COMMANDS, dest="command", metavar="COMMAND")
    return parser


def _problem_lines(exc: GriddError) -> list[str]:
    """Each of ``details.problems`` that the message does not already say."""
    problems = exc.details.get("problems") if isinstance(exc.details, dict) else None
    if not isinstance(problems, list):
        return []
    lines: list[str] = []
    for problem in problems:
        if isinstance(problem, dict) and "message" in problem:
            text = str(problem["message"])
        elif isinstance(problem, dict) and "field" in problem:
            text = f"{problem['field']}: {problem.get('problem', '')}"
        else:
            text = str(problem)
        if len(problems) > 1 or text not in exc.message:
            lines.append(f"  - {text}")
    return lines


def _detail_lines(exc: GriddError) -> list[str]:
    """The options a question offers (after a refused answer) and why a question closed."""
    details = exc.details if isinstance(exc.details, dict) else {}
    lines = []
    options = details.get("options")
    if isinstance(options, list) and options:
        lines.append("  offered options:")
        lines += [f"    {number}) {option}" for number, option in enumerate(options, start=1)]
    reason = details.get("closedReason")
    if reason:
        lines.append(f"  closed because: {reason}")
    return lines


def report(exc: GriddError) -> None:
    print(f"gridctl: {exc.message} [{exc.code}]", file=sys.stderr)
    for line in [*_problem_lines(exc), *_detail_lines(exc)]:
        print(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    forget_inherited_git_repository()  # the daemon it starts inherits our environment
    ctx = Context(args, parser=parser)
    try:
        run: Any = args.command_run
        return int(run(ctx))
    except DaemonUnreachable as exc:
        report(exc)
        return EXIT_UNREACHABLE
    except GriddError as exc:
        report(exc)
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
