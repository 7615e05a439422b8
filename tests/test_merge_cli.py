"""``gridctl`` for the review loop and the feature branch, against a real daemon it starts:
``session start --branch``, ``tasks diff``, ``tasks reject``, ``tasks approve --all`` and
``session finish`` reporting what the branch holds (and not merging it anywhere)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from gridd.client import GridClient
from tests.support.cli import gridctl
from tests.support.git import git
from tests.support.repos import agent_command, write_core_config
from tests.support.waits import wait_for


def test_review_loop_and_finish_from_the_command_line(ws: Path) -> None:
    write_core_config(
        ws,
        agents={"work": {"command": agent_command("trivial.py")}},
        scheduler={"default_agent": "work"},
    )
    main_before = git(ws, "rev-parse", "main").strip()
    for task_id in ("p", "q"):
        assert gridctl(ws, "task", "add", f"task {task_id}", "--id", task_id).returncode == 0
    started = gridctl(ws, "session", "start", "--branch", "feature/cli", "--on-conflict", "fail")
    assert started.returncode == 0, started.stderr
    with GridClient(ws / ".grid" / "gridd.sock") as c:
        wait_for(
            lambda: all(t["status"] == "review" for t in c.get("/tasks")),
            timeout=30,
            message="both tasks in review",
        )
        assert c.get("/state")["session"]["onConflict"] == "fail"
        diff = gridctl(ws, "tasks", "diff", "p")
        assert diff.returncode == 0, diff.stderr
        assert "added" in diff.stdout and "p.txt" in diff.stdout and "+work for p" in diff.stdout
        rejected = gridctl(ws, "tasks", "reject", "q", "-m", "say more")
        assert rejected.returncode == 0 and "now working" in rejected.stdout
        wait_for(lambda: c.get("/tasks/q")["status"] == "review", timeout=30)
        refused = gridctl(ws, "tasks", "approve")
        assert refused.returncode == 2 and "--all" in refused.stderr
        approved = gridctl(ws, "tasks", "approve", "--all")
        assert approved.returncode == 0, approved.stderr
        assert approved.stdout.count("approved") == 2
        wait_for(
            lambda: all(t["status"] == "done" for t in c.get("/tasks")),
            timeout=30,
            message="both tasks merged",
        )
    finished = gridctl(ws, "session", "finish")
    assert finished.returncode == 0, finished.stderr
    out = finished.stdout
    assert "feature/cli holds 4 commit(s) and 2 changed file(s) against main" in out
    assert "p.txt" in out and "q.txt" in out and "merged tasks: p, q" in out
    assert "git merge --no-ff feature/cli" in out
    assert git(ws, "rev-parse", "main").strip() == main_before  # never merged into the base


def test_the_demo_ends_with_the_feature_branch_holding_every_task() -> None:
    env = {**os.environ, "GRID_EXAMPLE_DELAY": "0.05", "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "gridd.demo"], capture_output=True, text=True, env=env, timeout=240
    )
    where = re.search(r"cd (/tmp/gridd-demo-\S+)", done.stdout)
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "already held the work of scaffold, api, cli" in done.stdout
        assert "demo-feature: one branch holding every task's work" in done.stdout
        assert "gridd: merge task integration" in done.stdout
        assert "12 files changed" in done.stdout
    finally:
        if where:
            shutil.rmtree(where.group(1), ignore_errors=True)
