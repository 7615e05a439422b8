"""``gridctl session ...``, ``gridctl agents`` and ``gridctl agent kill``: who is working.

A session is the desired state "hand ready tasks to agents, up to N at once, while the
budget lasts"; starting or stopping it records that intent and the daemon's scheduler
converges to it.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from gridd.cli import render, render_agents
from gridd.cli.context import EXIT_OK, Command, Context, group, positive_int, segment
from gridd.client import GridClient
from gridd.model import Agent, SessionState

# -- session --------------------------------------------------------------------------------


def build_session_start(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--branch",
        metavar="NAME",
        help="the feature branch the session's work is merged into; task branches start"
        " from its tip (created from --base if missing, continued if it exists; refused"
        " while checked out anywhere). Default: no feature branch, tasks start from HEAD",
    )
    parser.add_argument(
        "--base",
        metavar="BRANCH",
        help="where a new feature branch starts (default: the branch checked out in the"
        " main worktree)",
    )
    parser.add_argument(
        "--on-conflict",
        choices=["agent", "human", "fail"],
        help="when a merge conflicts or fails its check: rerun the task's agent on it"
        " (agent), leave it in review and ask (human), or fail the task (fail);"
        " default: [merge] on_conflict",
    )
    parser.add_argument(
        "--max-agents",
        type=positive_int,
        metavar="N",
        help="how many agents may run at once (default: scheduler.max_agents)",
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--budget",
        type=_usd,
        metavar="USD",
        help="stop starting agents once this many US dollars are spent"
        " (default: scheduler.budget_usd)",
    )
    budget.add_argument(
        "--no-budget",
        action="store_true",
        help="no spending cap at all: nothing limits what agents spend (gridd warns about it)",
    )


#: Said when the daemon logged no warning of its own (the session was changed in place).
UNBUDGETED = "this session has no budget cap: nothing limits what agents spend"


def _usd(text: str) -> float:
    try:
        value = float(text.strip().removeprefix("$"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an amount of US dollars: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more US dollars, got {text}")
    return value


def session_body(args: argparse.Namespace) -> dict[str, Any]:
    """The ``POST /session/start`` body: unset options left out, so the daemon's defaults
    apply; ``--no-budget`` is an explicit ``null`` budget, which is not the same thing."""
    body: dict[str, Any] = {
        key: value
        for key, value in (
            ("featureBranch", args.branch),
            ("baseBranch", args.base),
            ("maxAgents", args.max_agents),
            ("onConflict", args.on_conflict),
        )
        if value is not None
    }
    if args.no_budget:
        body["budgetUsd"] = None
    elif args.budget is not None:
        body["budgetUsd"] = args.budget
    return body


def _unbudgeted_warnings(client: GridClient, *, after: int) -> list[str]:
    """The daemon's ``session.unbudgeted`` warnings logged after event ``after``."""
    upto = int(client.get("/state")["daemon"]["lastEventId"])
    found: list[str] = []
    if upto <= after:
        return found
    stream = client.events(since=after, read_timeout=5.0)
    try:
        for event in stream:
            if event.type == "session.unbudgeted" and isinstance(event.data, dict):
                found.append(str(event.data.get("warning") or ""))
            if event.id is not None and event.id >= upto:
                break
    finally:
        stream.close()  # type: ignore[attr-defined]
    return [warning for warning in found if warning]


def run_session_start(ctx: Context) -> int:
    client = ctx.client()
    body = session_body(ctx.args)
    before = int(client.get("/state")["daemon"]["lastEventId"]) if ctx.args.no_budget else 0
    session = render.parse_wire(SessionState, client.post("/session/start", body), what="a session")
    base = f"on {session.feature_branch}" if session.feature_branch else "from HEAD"
    budget = (
        "no budget cap"
        if session.budget_usd is None
        else f"budget {render.money(session.budget_usd)}"
    )
    print(
        f"session started {base}"
        f" with up to {session.max_agents} agent{'s' if session.max_agents != 1 else ''},"
        f" {budget}"
    )
    if session.budget_usd is None:
        # The daemon logs its warning as an event; a session that was already running on
        # this branch is changed in place without one, so fall back to saying it ourselves.
        warnings = _unbudgeted_warnings(client, after=before) if ctx.args.no_budget else []
        for warning in warnings or [UNBUDGETED]:
            ctx.note(f"warning: {warning}")
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


def build_session_finish(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the raw report as JSON")


def run_session_finish(ctx: Context) -> int:
    data = ctx.client().post("/session/finish")
    if ctx.args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    base = data["baseBranch"] or data["base"][:12]
    print(
        f"session stopped. {data['featureBranch']} holds {data['commitCount']} commit(s)"
        f" and {len(data['files'])} changed file(s) against {base}:"
    )
    for commit in data["commits"][:30]:
        print(f"  {commit['sha'][:10]} {commit['subject']}")
    if data["commitCount"] > 30:
        print(f"  ... and {data['commitCount'] - 30} more")
    for f in data["files"]:
        counts = "binary" if f["additions"] is None else f"+{f['additions']} -{f['deletions']}"
        print(f"  {f['status']:<10} {counts:>12}  {f['path']}")
    print(f"merged tasks: {', '.join(data['mergedTasks']) or 'none'}")
    if data["unmergedTasks"]:
        rest = ", ".join(f"{t['id']} ({t['status']})" for t in data["unmergedTasks"])
        print(f"not merged: {rest}")
    print("gridd does not merge into your base branch or push. From here:")
    for step in data["nextSteps"]:
        print(f"  {step}")
    return EXIT_OK


SESSION = group(
    "start or stop the session that hands ready tasks to agents",
    {
        "start": Command(
            help="start handing ready tasks to agents",
            description="Start a session: ready tasks are started in priority order, each by an"
            " agent in its own worktree on branch grid/<task-id> from the feature branch, with"
            " at most --max-agents running at once, until the session's spending reaches"
            " --budget (then it stops with reason budget_exhausted). Starting again on the"
            " same branch changes --max-agents and the budget.",
            build=build_session_start,
            run=run_session_start,
        ),
        "finish": Command(
            help="stop the session and report what its feature branch holds",
            description="Stop the session (gracefully) and report what the feature branch"
            " holds against its base: commits, changed files, merged and unmerged tasks."
            " Nothing is merged into the base branch or pushed; the report shows how.",
            build=build_session_finish,
            run=run_session_finish,
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
    agents = [render.parse_wire(Agent, item) for item in data]
    agents.sort(key=lambda a: a.started_at)
    empty = "no agents" if ctx.args.all else "no running agents (--all shows exited ones)"
    render.console().print(render_agents.agents_table(agents, empty=empty))
    return EXIT_OK


AGENTS = Command(
    help="list running agents (--all: also exited ones)",
    description="List agents: id, task (and session number), profile, status (exit code, how"
    " long a waiting agent has waited, stalled), pid, how long they have run, cost, what they"
    " are doing (the tool in use, or their heartbeat's activity and message) and their last"
    " line of output; the cost column adds the tokens an agent reports (claude). Where a"
    " run is in a sandbox, a sandbox column shows its mode and what it may write; where one"
    " runs in a container, a 'runs in' column shows the executor and the container.",
    build=build_agents,
    run=run_agents,
)


def build_kill(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("agent_id", metavar="AGENT_ID", help="the agent to kill")


def run_kill(ctx: Context) -> int:
    data = ctx.client().post(f"/agents/{segment(ctx.args.agent_id, kind='agent')}/kill")
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
