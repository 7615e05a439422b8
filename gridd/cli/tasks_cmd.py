"""``gridctl task ...``: create, list, show and move single tasks through the native source.

Every action is one request; the daemon decides (a refused request comes back as a 4xx
whose message, and every listed problem, ``gridctl`` prints before exiting 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

from gridd.cli import render, render_tasks
from gridd.cli.context import EXIT_OK, EXIT_USAGE, Command, Context, group, positive_int, segment
from gridd.cli.render import parse_wire
from gridd.model import Agent, Task, TaskStatus


def _priority(text: str) -> int:
    if text not in {"0", "1", "2", "3", "4"}:
        raise argparse.ArgumentTypeError(f"priority is 0 (highest) to 4, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _console() -> Console:
    return render.console()


# -- add --------------------------------------------------------------------------------------


def build_add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("title", metavar="TITLE", help="a one-line title for the task")
    parser.add_argument(
        "--id",
        metavar="ID",
        help="the task id ([a-z0-9][a-z0-9._-]*, also its branch grid/ID;"
        " default: generated from the title)",
    )
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", metavar="TEXT", help="what the agent is asked to do")
    prompt.add_argument(
        "--prompt-file",
        metavar="FILE",
        type=argparse.FileType("r", encoding="utf-8"),
        help="read the prompt from FILE ('-' for standard input)",
    )
    parser.add_argument(
        "--depends-on",
        "--after",
        dest="depends_on",
        metavar="ID",
        action="append",
        default=[],
        help="a task this one depends on (repeat, or separate ids with commas);"
        " it starts once they are all done. --after is the same option",
    )
    parser.add_argument(
        "--priority",
        type=_priority,
        metavar="N",
        help="0 (highest) to 4 (lowest); ready tasks start in priority order (default 2)",
    )
    parser.add_argument(
        "--agent", metavar="PROFILE", help="the agent profile to run (default: the configured one)"
    )
    parser.add_argument(
        "--label", metavar="L", action="append", default=[], help="a label (repeatable)"
    )
    parser.add_argument(
        "--max-attempts",
        type=positive_int,
        metavar="N",
        help="how many times an agent may try before the task fails (default: configured)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="kill an agent that runs longer than this (default: the profile's)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the new task's id")


def task_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The ``POST /tasks`` body for ``task add``'s arguments (unset options left out)."""
    prompt = args.prompt
    if args.prompt_file is not None:
        with args.prompt_file as fh:
            prompt = fh.read()
    deps = [dep.strip() for value in args.depends_on for dep in value.split(",") if dep.strip()]
    spec: dict[str, Any] = {
        "id": args.id,
        "title": args.title,
        "prompt": prompt,
        "priority": args.priority,
        "dependsOn": deps or None,
        "labels": args.label or None,
        "agent": args.agent,
        "maxAttempts": args.max_attempts,
        "timeoutSeconds": args.timeout,
    }
    return {key: value for key, value in spec.items() if value is not None}


def run_add(ctx: Context) -> int:
    task = parse_wire(Task, ctx.client().post("/tasks", task_spec(ctx.args)))
    if ctx.args.quiet:
        print(task.id)
    else:
        print(f"created task {task.id} ({task.status.value})")
    return EXIT_OK


# -- list and show ----------------------------------------------------------------------------


def _statuses(text: str) -> str:
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = {status.value for status in TaskStatus}
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown status {', '.join(unknown) or repr(text)}; known: {', '.join(known)}"
        )
    return ",".join(names)


def build_list(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--status",
        type=_statuses,
        metavar="S,S",
        help="only tasks in these comma-separated statuses"
        f" ({', '.join(status.value for status in TaskStatus)})",
    )
    parser.add_argument("--json", action="store_true", help="print the raw task list as JSON")


def run_list(ctx: Context) -> int:
    params = {"status": ctx.args.status} if ctx.args.status else None
    data = ctx.client().get("/tasks", params=params)
    if ctx.args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    tasks = [parse_wire(Task, item) for item in data]
    _console().print(render_tasks.task_table(tasks))
    return EXIT_OK


def build_show(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", metavar="ID", help="the task to show")
    parser.add_argument("--json", action="store_true", help="print the raw task as JSON")


def run_show(ctx: Context) -> int:
    client = ctx.client()
    data = client.get(f"/tasks/{segment(ctx.args.task_id, kind='task')}")
    if ctx.args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    task = parse_wire(Task, data)
    agents = [parse_wire(Agent, a) for a in client.get("/agents", params={"all": "1"})]
    _console().print(render_tasks.task_detail(task, [a for a in agents if a.task_id == task.id]))
    return EXIT_OK


# -- transitions --------------------------------------------------------------------------------


def _id_only(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", metavar="ID", help="the task's id")


def _transition(method: str, suffix: str, *, done: str, help: str, description: str) -> Command:
    """An action that sends one request about a task and reports its new status."""

    def run(ctx: Context) -> int:
        path = f"/tasks/{segment(ctx.args.task_id, kind='task')}{suffix}"
        task = parse_wire(Task, ctx.client().request(method, path))
        print(f"task {task.id} {done}: now {task.status.value}")
        return EXIT_OK

    return Command(help=help, build=_id_only, run=run, description=description)


# -- the review loop ---------------------------------------------------------------------------


def build_approve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", metavar="ID", nargs="?", help="the task to approve")
    parser.add_argument(
        "--all", action="store_true", help="approve every task in review, oldest first"
    )
    parser.add_argument(
        "--accept-markers",
        metavar="PATH",
        action="append",
        default=[],
        help="let the merge keep conflict-marker-like lines in PATH (a glob; repeatable);"
        " recorded in the event log",
    )


def run_approve(ctx: Context) -> int:
    if ctx.args.all == (ctx.args.task_id is not None):
        print("gridctl task approve: give a task ID or --all (not both)", file=sys.stderr)
        return EXIT_USAGE
    client = ctx.client()
    if ctx.args.task_id is not None:
        ids = [ctx.args.task_id]
    else:
        waiting = [parse_wire(Task, t) for t in client.get("/tasks", params={"status": "review"})]
        ids = [t.id for t in sorted(waiting, key=lambda t: (t.updated_at, t.id))]
        if not ids:
            print("no task is in review")
    for task_id in ids:
        path = f"/tasks/{segment(task_id, kind='task')}/approve"
        body = {"acceptMarkers": ctx.args.accept_markers} if ctx.args.accept_markers else None
        task = parse_wire(Task, client.post(path, body))
        after = "queued for the merge" if task.status == TaskStatus.MERGING else "done"
        print(f"task {task.id} approved: now {task.status.value} ({after})")
    return EXIT_OK


def build_reject(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", metavar="ID", help="the task to send back")
    feedback = parser.add_mutually_exclusive_group(required=True)
    feedback.add_argument("-m", "--feedback", metavar="TEXT", help="what the agent should change")
    feedback.add_argument(
        "--feedback-file",
        metavar="FILE",
        type=argparse.FileType("r", encoding="utf-8"),
        help="read the feedback from FILE ('-' for standard input)",
    )


def run_reject(ctx: Context) -> int:
    text = ctx.args.feedback
    if ctx.args.feedback_file is not None:
        with ctx.args.feedback_file as fh:
            text = fh.read()
    path = f"/tasks/{segment(ctx.args.task_id, kind='task')}/reject"
    task = parse_wire(Task, ctx.client().post(path, {"feedback": text}))
    print(f"task {task.id} sent back to its agent with your feedback: now {task.status.value}")
    return EXIT_OK


def build_diff(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", metavar="ID", help="the task whose change to show")
    parser.add_argument("--stat", action="store_true", help="only the changed files")
    parser.add_argument("--json", action="store_true", help="print the raw diff as JSON")


def run_diff(ctx: Context) -> int:
    data = ctx.client().get(f"/tasks/{segment(ctx.args.task_id, kind='task')}/diff")
    if ctx.args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    print(f"task {data['taskId']}: {data['base'][:12]}..{data['head'][:12]}")
    for f in data["files"]:
        counts = "binary" if f["additions"] is None else f"+{f['additions']} -{f['deletions']}"
        print(f"  {f['status']:<10} {counts:>12}  {f['path']}")
    if not data["files"]:
        print("  (no change)")
    if not ctx.args.stat and data["patch"]:
        print()
        print(data["patch"], end="" if data["patch"].endswith("\n") else "\n")
        if data.get("truncated"):
            print("(patch truncated; see git diff for the rest)")
    return EXIT_OK


TASK = group(
    "add, list, show, cancel, start, stop, approve, reject or diff tasks",
    {
        "add": Command(
            help="create a task",
            description="Create a task for the native source. It is ready at once unless it"
            " depends (--depends-on, or --after) on tasks that are not done. Prints the new task's id and status.",
            build=build_add,
            run=run_add,
        ),
        "list": Command(
            help="list tasks: id, status, priority, dependencies, agent, attempts, sessions,"
            " cost, branch",
            description="List tasks in a table (or as JSON), optionally only some statuses.",
            build=build_list,
            run=run_list,
        ),
        "show": Command(
            help="show every field of one task (sessions, cost, waiting), its changed files,"
            " error and agents",
            build=build_show,
            run=run_show,
        ),
        "cancel": _transition(
            "DELETE",
            "",
            done="cancelled",
            help="cancel a task (its agent is stopped; its branch is kept)",
            description="Cancel a task: it will not be started again, and a running agent is stopped.",
        ),
        "start": _transition(
            "POST",
            "/start",
            done="started",
            help="start a task now, even without a session",
            description="Start a task now, ahead of the queue and even with no session running. Refused"
            " (exit 1, naming them) while its dependencies are not done.",
        ),
        "stop": _transition(
            "POST",
            "/stop",
            done="stopped",
            help="stop a working task's agent; the task returns to ready",
            description="Stop the agent of a working task (its work so far is committed on its branch);"
            " the task returns to ready.",
        ),
        "approve": Command(
            help="approve a task in review (or --all): it is merged into the feature branch",
            description="Approve a task in review, or with --all every task in review (oldest"
            " first). With a session feature branch the task becomes merging: it is merged"
            " into the branch one at a time, and done (so its dependants may start) once"
            " merged. A conflict or a failed [merge] check goes to the session's onConflict"
            " policy. Without a feature branch it is done at once.",
            build=build_approve,
            run=run_approve,
        ),
        "reject": Command(
            help="send a task in review back to its agent with feedback",
            description="Reject a task in review: its agent runs again in the same worktree"
            " (and conversation, where the agent supports it) with your feedback in its"
            " prompt. It comes back to review when it finishes.",
            build=build_reject,
            run=run_reject,
        ),
        "diff": Command(
            help="show a task's change against the commit its branch started from",
            description="Show the files a task changed (status, lines added and removed) and"
            " the patch, against the commit its branch started from. --stat: files only.",
            build=build_diff,
            run=run_diff,
        ),
    },
    description="Work with single tasks. Refusals (unknown dependency, wrong status, ...)"
    " print the daemon's reason and exit 1.",
)
