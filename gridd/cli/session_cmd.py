"""``gridctl session ...``, ``gridctl agents`` and ``gridctl agent kill``: who is working.

A session is the desired state "hand ready tasks to agents, up to N at once"; starting or
stopping it records that intent and the daemon's scheduler converges to it.
"""

from __future__ import annotations

import argparse
import json

from pydantic import ValidationError
from rich.console import Console

from gridd.cli import render
from gridd.cli.context import EXIT_OK, Command, Context, group, positive_int, segment
from gridd.errors import GriddError
from gridd.model import Agent, SessionState


def _session(data: object) -> SessionState:
    try:
        return SessionState.model_validate(data)
    except ValidationError as exc:
        raise GriddError(
            f"the daemon sent a session this gridctl does not understand: {exc.errors()[0]['msg']}",
            code="bad_response",
        ) from None


# -- session --------------------------------------------------------------------------------


def build_session_start(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--branch",
        metavar="NAME",
        help="the feature branch task branches start from (created from HEAD if missing;"
        " default: task branches start from HEAD)",
    )
    parser.add_argument(
        "--max-agents",
        type=positive_int,
        metavar="N",
        help="how many agents may run at once (default: scheduler.max_agents)",
    )


def run_session_start(ctx: Context) -> int:
    body = {"featureBranch": ctx.args.branch, "maxAgents": ctx.args.max_agents}
    session = _session(
        ctx.client().post(
            "/session/start", {key: value for key, value in body.items() if value is not None}
        )
    )
    base = f"on {session.feature_branch}" if session.feature_branch else "from HEAD"
    print(
        f"session started {base}"
        f" with up to {session.max_agents} agent{'s' if session.max_agents != 1 else ''}"
    )
    return EXIT_OK


def build_session_stop(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help="kill the agents at once (SIGKILL) instead of SIGTERM and a grace period",
    )


def run_session_stop(ctx: Context) -> int:
    params = {"force": "1"} if ctx.args.force else None
    ctx.client().post("/session/stop", params=params)
    how = "agents killed" if ctx.args.force else "agents asked to stop"
    print(f"session stopped ({how}; their work so far is committed on their branches)")
    return EXIT_OK


SESSION = group(
    "start or stop the session that hands ready tasks to agents",
    {
        "start": Command(
            help="start handing ready tasks to agents",
            description="Start a session: ready tasks are started in priority order, each by an"
            " agent in its own worktree on branch grid/<task-id> from the feature branch, with"
            " at most --max-agents running at once. Starting again changes --max-agents.",
            build=build_session_start,
            run=run_session_start,
        ),
        "stop": Command(
            help="stop the session and its agents",
            description="Stop the session: no new agents are started and running ones are"
            " stopped (SIGTERM to their process group, then SIGKILL after the grace period,"
            " or at once with --force). Their tasks return to ready.",
            build=build_session_stop,
            run=run_session_stop,
        ),
    },
)


# -- agents -----------------------------------------------------------------------------------


def build_agents(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--all", action="store_true", help="include agents that have exited (default: running)"
    )
    parser.add_argument("--json", action="store_true", help="print the raw agent list as JSON")


def run_agents(ctx: Context) -> int:
    data = ctx.client().get("/agents", params={"all": "1"} if ctx.args.all else None)
    if ctx.args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    try:
        agents = [Agent.model_validate(item) for item in data]
    except ValidationError as exc:
        raise GriddError(
            f"the daemon sent an agent this gridctl does not understand: {exc.errors()[0]['msg']}",
            code="bad_response",
        ) from None
    agents.sort(key=lambda a: a.started_at)
    empty = "no agents" if ctx.args.all else "no running agents (--all shows exited ones)"
    Console(highlight=False).print(render.agents_table(agents, empty=empty))
    return EXIT_OK


AGENTS = Command(
    help="list running agents (--all: also exited ones)",
    description="List agents: id, task, profile, status (and exit code), pid, how long they"
    " have run and their last line of output.",
    build=build_agents,
    run=run_agents,
)


def build_kill(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("agent_id", metavar="AGENT_ID", help="the agent to kill")


def run_kill(ctx: Context) -> int:
    data = ctx.client().post(f"/agents/{segment(ctx.args.agent_id)}/kill")
    print(f"killing agent {data['id']} (task {data['taskId']} is blocked until you start it)")
    return EXIT_OK


AGENT = group(
    "act on one agent",
    {
        "kill": Command(
            help="kill an agent at once (SIGKILL to its process group)",
            description="Kill an agent and its whole process group with SIGKILL. Its task"
            " becomes blocked (a person stopped it) until 'gridctl task start'.",
            build=build_kill,
            run=run_kill,
        ),
    },
)
