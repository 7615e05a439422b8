"""``make demo``: gridd's main job, end to end, in a throwaway repository.

A real daemon, a plan of six tasks in three waves for the bundled ``example`` agent, a
session with three agents on a feature branch, a live view driven by the event stream,
approval in wave order as each wave reaches review (each approved task is merged into the
feature branch, and the next wave starts from the merged work), and at the end the feature
branch's log and diffstat: one branch holding every task's work.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gridd.cli import daemonctl
from gridd.cli.render import parse_state
from gridd.cli.render_status import STOP_REASONS, status_view
from gridd.client import GridClient
from gridd.errors import GriddError
from gridd.workspace import Workspace

PLAN: list[dict[str, Any]] = [
    {"id": "scaffold", "title": "Create the project scaffold", "priority": 0},
    {"id": "docs", "title": "Write the README", "priority": 2},
    {"id": "api", "title": "Add the HTTP API", "dependsOn": ["scaffold"]},
    {"id": "cli", "title": "Add the command-line client", "dependsOn": ["scaffold"]},
    {
        "id": "integration",
        "title": "Wire the API and the CLI together",
        "dependsOn": ["api", "cli"],
    },
    {"id": "release", "title": "Prepare the first release", "dependsOn": ["docs", "api"]},
]
TIMEOUT_SECONDS = 90


def make_repo() -> Path:
    root = Path(tempfile.mkdtemp(prefix="gridd-demo-", dir="/tmp"))
    run = {"check": True, "cwd": root, "capture_output": True}
    subprocess.run(["git", "init", "-q", "-b", "main"], **run)  # type: ignore[call-overload]
    subprocess.run(["git", "config", "user.name", "gridd demo"], **run)  # type: ignore[call-overload]
    subprocess.run(["git", "config", "user.email", "demo@gridd.invalid"], **run)  # type: ignore[call-overload]
    (root / "README.md").write_text("# demo project\n")
    subprocess.run(["git", "add", "README.md"], **run)  # type: ignore[call-overload]
    subprocess.run(["git", "commit", "-q", "-m", "initial commit"], **run)  # type: ignore[call-overload]
    return root


FEATURE = "demo-feature"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout


def summary(root: Path, client: GridClient) -> Table:
    table = Table(title="What the agents produced", title_justify="left")
    table.add_column("task")
    table.add_column("branch")
    table.add_column("started from")
    table.add_column("merged as")
    table.add_column("changed files")
    for task in client.get("/tasks"):
        table.add_row(
            task["id"],
            task.get("branch") or "-",
            (task.get("baseCommit") or "-")[:9],
            (task.get("mergeCommit") or "-")[:9],
            ", ".join(task.get("changedFiles", [])),
        )
    return table


def feature_report(console: Console, root: Path) -> bool:
    """The feature branch's log and diffstat against main; True when it holds every task."""
    console.print(f"\n[bold]{FEATURE}[/bold]: one branch holding every task's work")
    console.print(_git(root, "log", "--graph", "--oneline", f"main..{FEATURE}", "--").rstrip())
    console.print(_git(root, "diff", "--stat", f"main...{FEATURE}", "--").rstrip())
    files = set(_git(root, "ls-tree", "-r", "--name-only", FEATURE).split())
    wanted = {f"notes/{t['id']}.md" for t in PLAN}
    missing = sorted(wanted - files)
    if missing:
        console.print(f"[red]the feature branch is missing {', '.join(missing)}[/red]")
    return not missing


def integration_built_on_earlier_waves(console: Console, root: Path, client: GridClient) -> bool:
    """The integration task's worktree started from a commit holding its dependencies' work."""
    task = client.get("/tasks/integration")
    base = task.get("baseCommit") or ""
    files = set(_git(root, "ls-tree", "-r", "--name-only", base).split()) if base else set()
    deps = ["scaffold", "api", "cli"]
    held = [d for d in deps if f"notes/{d}.md" in files]
    console.print(
        f"the integration task started from {base[:9]}, which already held the work of"
        f" {', '.join(held) or 'nothing'}"
    )
    return held == deps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gridd.demo",
        description="Run gridd's demo: a real daemon, six example tasks in three waves, a live"
        " view, approval in wave order and a summary, in a throwaway repository under /tmp.",
    )
    parser.parse_args(argv)
    console = Console()
    root = make_repo()
    ws = Workspace(root=root)
    console.print(f"[bold]gridd demo[/bold] in a throwaway repository: {root}")
    os.environ.setdefault("GRID_EXAMPLE_DELAY", "0.4")
    try:
        status, _ = daemonctl.start(ws)
    except GriddError as exc:
        console.print(f"[red]could not start gridd:[/red] {exc.message}")
        return 1
    console.print(f"gridd {status.version} is running (pid {status.pid}) on {ws.socket_path}")
    client = GridClient(ws.socket_path)
    try:
        plan = client.post("/plans", {"tasks": PLAN})
        waves: list[list[str]] = plan["waves"]
        console.print(
            "plan loaded: "
            + "  ".join(f"wave {i + 1}: {', '.join(w)}" for i, w in enumerate(waves))
        )
        client.post("/session/start", {"featureBranch": FEATURE, "maxAgents": 3})
        ok = watch_and_approve(console, client, waves)
        client.post("/session/stop")
        console.print(summary(root, client))
        max_seen = max_concurrency(client)
        console.print(f"at most {max_seen} agents ran at once (limit 3)")
        ok = integration_built_on_earlier_waves(console, root, client) and ok
        ok = feature_report(console, root) and ok
    finally:
        client.close()
        daemonctl.stop(ws)
    console.print(
        f"daemon stopped. Explore the result:  cd {root} && git log --oneline --graph {FEATURE}"
    )
    return 0 if ok else 1


def watch_and_approve(console: Console, client: GridClient, waves: list[list[str]]) -> bool:
    """Live status until every task is done, approving each wave once it is all in review."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    approved = 0
    last_id = 0
    log: list[str] = []
    with Live(console=console, refresh_per_second=8, transient=False) as live:
        while time.monotonic() < deadline:
            for event in client.events(since=last_id, read_timeout=0.3):
                last_id = event.id or last_id
                line = describe(event.type, event.data)
                if line:
                    log.append(line)
                    if not console.is_terminal:
                        console.print(line)
            state = parse_state(client.get("/state"))
            statuses = {t.id: t.status.value for t in state.tasks}
            if approved < len(waves) and all(statuses[i] == "review" for i in waves[approved]):
                for task_id in waves[approved]:
                    client.post(f"/tasks/{task_id}/approve")
                log.append(f"approved wave {approved + 1}: {', '.join(waves[approved])}")
                if not console.is_terminal:
                    console.print(log[-1])
                approved += 1
                continue
            recent = Text("\n".join(log[-8:]), style="dim") if console.is_terminal else Text()
            live.update(Group(status_view(state), recent))
            if all(s == "done" for s in statuses.values()):
                return True
            if any(s in ("failed", "blocked") for s in statuses.values()):
                console.print("[red]a task failed; see gridctl status[/red]")
                return False
    console.print("[red]the demo did not finish in time[/red]")
    return False


def describe(event_type: str, data: Any) -> str | None:
    if event_type == "agent.spawned":
        return f"spawned {data['agentId']} for {data['taskId']} (pid {data['pid']})"
    if event_type == "agent.completed":
        return f"{data['taskId']} is in review: {', '.join(data['changedFiles'])}"
    if event_type == "task.merged":
        return f"{data['taskId']} merged into {data['featureBranch']} as {data['commit'][:9]}"
    if event_type == "task.merge_conflict":
        return f"{data['taskId']} conflicts with {FEATURE} in {', '.join(data['files'])}"
    if event_type == "agent.failed":
        return f"{data['taskId']} failed: {data['error']}"
    if event_type == "session.started":
        return f"session started on {data['featureBranch']}, at most {data['maxAgents']} agents"
    if event_type == "session.stopped":
        reason = data["reason"]
        return f"session stopped ({reason}: {STOP_REASONS.get(reason, 'see gridctl status')})"
    return None


def max_concurrency(client: GridClient) -> int:
    running: set[str] = set()
    peak = 0
    for event in client.events(
        since=0,
        types=["agent.spawned", "agent.completed", "agent.failed", "agent.stopped"],
        read_timeout=0.5,
    ):
        if event.type == "agent.spawned":
            running.add(event.data["agentId"])
        else:
            running.discard(event.data["agentId"])
        peak = max(peak, len(running))
    return peak


if __name__ == "__main__":
    sys.exit(main())
