"""The conflict radar: overlaps between live tasks and with what landed on the feature
branch, textual conflicts predicted by ``git merge-tree``, all cleared once merged; the
decisions tested as pure functions, the radar itself on a real daemon and repository."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.git.radar import held, overlaps, uncommitted
from gridd.model import Task, TaskStatus
from tests.support.api import wait_task_status
from tests.support.cli import gridctl
from tests.support.daemons import core_daemon
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for


def test_overlaps_pair_live_tasks_and_landed_work() -> None:
    changed = {
        "a": frozenset({"x.py", "y.py"}),
        "b": frozenset({"y.py", "z.py"}),
        "c": frozenset({"q.py"}),
    }
    landed = {"c": frozenset({"q.py", "other.py"}), "a": frozenset({"nothing.py"})}
    assert overlaps(changed, landed) == [
        ("tasks", ("a", "b"), ["y.py"]),
        ("feature", ("c",), ["q.py"]),
    ]


def test_hold_policy_holds_a_ready_task_whose_declared_files_a_live_task_changes() -> None:
    tasks = [
        Task(id="live", title="l", status=TaskStatus.WORKING),
        Task(id="clash", title="c", status=TaskStatus.READY, files=["api.py"]),
        Task(id="free", title="f", status=TaskStatus.READY, files=["cli.py"]),
        Task(id="undeclared", title="u", status=TaskStatus.READY),
    ]
    assert held(tasks, {"live": frozenset({"api.py"})}) == frozenset({"clash"})


def test_the_radar_reads_a_worktree_without_taking_its_index_lock(tmp_path: Path) -> None:
    """A stale index (a tracked file touched, content unchanged) is what plain ``git status``
    rewrites under ``index.lock``; the radar polls live worktrees, so it must not."""

    def run(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    run("init", "-q")
    (tmp_path / "kept.txt").write_text("same\n")
    run("add", "kept.txt")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    index = tmp_path / ".git" / "index"
    stale = index.stat().st_mtime_ns - 5_000_000_000
    os.utime(tmp_path / "kept.txt", ns=(stale, stale))  # stat info no longer matches
    (tmp_path / "new.txt").write_text("agent's work\n")
    before = index.stat().st_mtime_ns

    assert asyncio.run(uncommitted(tmp_path)) == frozenset({"new.txt"})
    assert index.stat().st_mtime_ns == before  # the index was not rewritten
    subprocess.run(["git", "-C", str(tmp_path), "status"], check=True, capture_output=True)
    assert index.stat().st_mtime_ns != before  # while plain git status would have


@pytest.fixture
def logdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="glog") as d:
        yield Path(d)


def test_radar_reports_overlap_and_predicted_conflict_then_clears_after_merge(
    repo: Path, logdir: Path
) -> None:
    write_core_config(
        repo,
        agents={"edit": {"command": agent_command("editor.py", str(logdir), "{prompt}")}},
        scheduler={"default_agent": "edit"},
    )
    with (repo / ".grid" / "config.toml").open("a") as fh:
        fh.write("\n[merge]\nradar_seconds = 0.3\n")
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post(
            "/plans",
            {
                "tasks": [
                    {"id": "x", "title": "x", "prompt": json.dumps({"write": {"s.txt": "x\n"}})},
                    {"id": "y", "title": "y", "prompt": json.dumps({"write": {"s.txt": "y\n"}})},
                ]
            },
        )
        c.post("/session/start", {"featureBranch": "feature/radar"})
        wait_task_status(c, "x", "review")
        wait_task_status(c, "y", "review")
        # An overlap shows as soon as both have written s.txt; the prediction needs both
        # branches committed (merge-tree reads commits), which follows within a sweep.
        found = wait_for(
            lambda: (
                (items := c.get("/conflicts")["conflicts"])
                and items[0]["predictedConflict"]
                and items
            ),
            timeout=10,
        )
        assert found == [
            {
                "id": "tasks:x+y",
                "kind": "tasks",
                "tasks": ["x", "y"],
                "files": ["s.txt"],
                "predictedConflict": True,
                "conflictFiles": ["s.txt"],
                "featureCommit": None,
            }
        ]
        assert c.get("/state")["conflicts"] == found
        status = gridctl(repo, "conflicts")
        assert status.returncode == 0 and "x + y" in status.stdout and "s.txt" in status.stdout
        c.post("/tasks/x/approve")
        wait_task_status(c, "x", "done")
        # x landed: y now overlaps what is on the feature branch, and would conflict with it
        landed = wait_for(
            lambda: [i for i in c.get("/conflicts")["conflicts"] if i["kind"] == "feature"],
            timeout=10,
        )
        assert landed[0]["tasks"] == ["y"] and landed[0]["predictedConflict"] is True
        c.post("/tasks/y/approve")  # conflicts; the agent policy resolves it, then approve
        wait_for(lambda: len(list(logdir.glob("y-*.json"))) == 2, timeout=30)
        wait_task_status(c, "y", "review")
        c.post("/tasks/y/approve")
        wait_task_status(c, "y", "done")
        wait_for(lambda: not c.get("/conflicts")["conflicts"], timeout=10)
        types = [e.type for e in event_log(c, types={"conflict.detected", "conflict.cleared"})]
        assert types[0] == "conflict.detected" and types[-1] == "conflict.cleared"
