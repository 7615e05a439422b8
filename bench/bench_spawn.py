"""Spawn latency: a task made ready -> ``agent.spawned`` received by an SSE client.

A real daemon serves a fresh repository whose ``.grid/config.toml`` names a trivial agent
(``/bin/sh -c`` writing one file, so the run ends with a commit like real work). For each
of N tasks (15; 6 with ``--quick``), one at a time: ``POST /tasks/{id}/start`` is sent on a
keep-alive connection, and the clock stops when a raw ``GET /events`` reader (a thread in
this process, timestamping each event as it arrives) sees that task's ``agent.spawned``.
The run is then left to finish (``agent.completed``) before the next task starts, so each
spawn is measured alone.

Between the request and the event gridd wakes its scheduler, plans, creates the task's
worktree and branch (``git rev-parse`` x2, ``git worktree add -b``, ``git config``), writes
the run directory, launches the per-agent shim (``python -I -S shim.py``, which
double-forks), waits for the shim's ``agent.json``, then publishes.

Baseline (same run, another fresh repository): ``git worktree add -b`` plus
``subprocess.Popen`` of the same agent command in that worktree, until ``Popen`` returns
(the child has exec'd), N times. Target: gridd's median <= 3 x the baseline's median.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from bench.baselines import git_env
from bench.common import (
    Check,
    RawHTTP,
    latency_baseline,
    make_repo,
    median,
    ms_summary,
    remove_repo,
    result,
)
from bench.harness import TRIVIAL_AGENT, EventTap, agent_daemon, api, of_task

NAME = "spawn"
RUNS = 15
RUNS_QUICK = 6
TARGET_RATIO = 3.0

# -- baseline -------------------------------------------------------------------------------------


def _baseline(runs: int) -> list[float]:
    """``git worktree add -b`` + ``Popen`` of the agent in it, until ``Popen`` returns."""
    root = make_repo()
    env = git_env()
    try:
        (root / ".git" / "info" / "exclude").write_text(".grid/\n")
        wt_dir = root / ".grid" / "worktrees"
        wt_dir.mkdir(parents=True)
        times = []
        for i in range(runs):
            path = wt_dir / f"b{i}"
            agent_env = {**env, "GRID_TASK_ID": f"b{i}"}
            started = time.perf_counter()
            subprocess.run(
                ["git", "worktree", "add", "-q", "-b", f"grid/b{i}", "--", str(path), "HEAD"],
                cwd=root,
                env=env,
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            proc = subprocess.Popen(
                TRIVIAL_AGENT,
                cwd=path,
                env=agent_env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            times.append(time.perf_counter() - started)
            proc.wait()
        return times
    finally:
        remove_repo(root)


# -- gridd --------------------------------------------------------------------------------------------


def _gridd(runs: int) -> dict[str, Any]:
    agents = {"trivial": {"command": TRIVIAL_AGENT}}
    latencies: list[float] = []
    types = ["agent.spawned", "agent.completed", "agent.failed", "task.start_failed"]
    with (
        agent_daemon(agents, default_agent="trivial") as daemon,
        RawHTTP(daemon.sock, timeout=10) as http,
        EventTap(daemon.sock, types=types) as tap,
    ):
        ids = [f"spawn-{i}" for i in range(runs + 1)]  # the first is a warm-up
        api(http, "POST", "/tasks", [{"id": i, "title": i} for i in ids])
        for n, task_id in enumerate(ids):
            started = time.monotonic()
            api(http, "POST", f"/tasks/{task_id}/start")
            arrived, event = tap.expect(of_task(task_id), timeout=30)
            if event.type != "agent.spawned":
                raise RuntimeError(f"{task_id}: {event.type} {event.data}")
            if n:
                latencies.append(arrived - started)
            _, done = tap.expect(of_task(task_id), timeout=30)
            if done.type != "agent.completed":
                raise RuntimeError(f"{task_id}: {done.type} {done.data}")
    return {"latencies": latencies}


def run(quick: bool) -> dict[str, Any]:
    runs = RUNS_QUICK if quick else RUNS
    base = _baseline(runs)
    gridd = _gridd(runs)["latencies"]
    base_ms = median(base) * 1000
    gridd_ms = median(gridd) * 1000
    ratio = gridd_ms / base_ms
    return result(
        name=NAME,
        title="spawn latency: task started -> agent.spawned at an SSE client",
        checks=[
            Check(
                metric=f"median spawn latency ({runs} spawns)",
                value=round(gridd_ms, 2),
                unit="ms",
                target=f"<= {TARGET_RATIO:g} x baseline ({TARGET_RATIO * base_ms:.1f} ms)",
                passed=ratio <= TARGET_RATIO,
            )
        ],
        baseline=latency_baseline(
            "git worktree add -b + Popen of the same agent, until Popen returns", base
        ),
        ratio=ratio,
        ratio_label="gridd median / baseline median",
        figures={
            "runs": runs,
            "gridd_ms": ms_summary(gridd),
            "agent": TRIVIAL_AGENT,
        },
        quick=quick,
        summary=f"median {gridd_ms:.1f} ms (min {min(gridd) * 1000:.1f}, max"
        f" {max(gridd) * 1000:.1f}); worktree add + Popen {base_ms:.1f} ms; ratio {ratio:.2f}",
        notes="one task at a time, each run left to complete before the next; first spawn"
        " is a warm-up and not counted",
    )
