"""Throughput: 200 tasks of a trivial agent with ``maxAgents=8``, start to all in review.

A real daemon serves a fresh repository with the trivial agent of ``bench_spawn`` (one
file written in its worktree) as the default profile. The 200 independent tasks (50 with
``--quick``) are loaded by one ``POST /plans``; the clock starts when ``POST
/session/start {maxAgents: 8}`` is sent and stops when a raw SSE reader has seen the
200th ``agent.completed`` (each one means: the agent exited 0, its work is committed on
``grid/<id>``, the task is in ``review``). The reader also tracks how many agents were live
at once (spawned minus finished) to show ``maxAgents`` was used and respected.

Baseline (same run, another fresh repository): a plain asyncio script with a semaphore of
8 doing the same work per task: ``git worktree add -b``, run the agent in the worktree,
``git status --porcelain``, ``git add -A`` and ``git commit`` when dirty, ``git diff
--name-only base..HEAD`` (its one ``git worktree add`` at a time: concurrent adds in one
repository race on ``.git/worktrees``). Target: gridd's wall time <= 1.5 x the baseline's.

Both are CPU-bound on 2 cores and sensitive to whatever else runs, so they alternate for
two rounds (baseline first) and the fastest of each is compared; all are reported.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.bench_spawn import (
    GIT_IDENTITY,
    TRIVIAL_AGENT,
    EventTap,
    agent_daemon,
    api,
    git_env,
)
from bench.common import Check, RawHTTP, make_repo, remove_repo, result
from gridd.client import SSEEvent

NAME = "throughput"
TASKS = 200
TASKS_QUICK = 50
MAX_AGENTS = 8
ROUNDS = 2
TARGET_RATIO = 1.5
TIMEOUT_S = 120.0


# -- baseline -------------------------------------------------------------------------------------


async def _git(cwd: Path, *args: str, env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=str(cwd),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await proc.communicate()
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.terminate()  # git removes its lock files on SIGTERM
            await asyncio.shield(proc.wait())
        raise
    if proc.returncode:
        raise RuntimeError(f"git {' '.join(args[:3])}: {err.decode().strip()}")
    return out.decode()


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (all cores, all processes)."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


async def _baseline(tasks: int) -> dict[str, float]:
    root = make_repo()
    env = git_env()
    try:
        (root / ".git" / "info" / "exclude").write_text(".grid/\n")
        wt_dir = root / ".grid" / "worktrees"
        wt_dir.mkdir(parents=True)
        base = (await _git(root, "rev-parse", "HEAD", env=env)).strip()
        sem = asyncio.Semaphore(MAX_AGENTS)
        # Concurrent ``git worktree add`` in one repository race (one reads another's
        # half-written .git/worktrees/<name>/commondir and fails): a plain script serialises
        # just that step.
        add_lock = asyncio.Lock()

        async def one(i: int) -> None:
            task_id = f"b{i}"
            path = wt_dir / task_id
            async with sem:
                async with add_lock:
                    await _git(
                        root,
                        "worktree",
                        "add",
                        "-q",
                        "-b",
                        f"grid/{task_id}",
                        "--",
                        str(path),
                        base,
                        env=env,
                    )
                agent = await asyncio.create_subprocess_exec(
                    *TRIVIAL_AGENT,
                    cwd=str(path),
                    env={**env, "GRID_TASK_ID": task_id},
                    stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True,
                )
                if await agent.wait() != 0:
                    raise RuntimeError(f"agent {task_id} failed")
                if (
                    await _git(path, "status", "--porcelain", "--untracked-files=all", env=env)
                ).strip():
                    await _git(path, "add", "-A", "--", ".", env=env)
                    await _git(
                        path, *GIT_IDENTITY, "commit", "-q", "--no-verify", "-m", task_id, env=env
                    )
                await _git(path, "diff", "--name-only", f"{base}..HEAD", "--", env=env)

        busy0 = machine_busy()
        started = time.monotonic()
        runs = [asyncio.create_task(one(i)) for i in range(tasks)]
        try:
            await asyncio.gather(*runs)
        finally:
            for task in runs:  # on a failure, no git may still write while we clean up
                task.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
        return {"seconds": time.monotonic() - started, "machine_cpu_s": machine_busy() - busy0}
    finally:
        remove_repo(root)


# -- gridd --------------------------------------------------------------------------------------------


class _Tally:
    """Counts completions and live agents from the event stream (in the reader thread)."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.completed = 0
        self.failed: list[dict[str, Any]] = []
        #: ``task.start_failed``: the start is retried after a backoff, so it only costs time.
        self.start_failures: list[dict[str, Any]] = []
        self.live = 0
        self.peak = 0
        self.first_spawn: float | None = None
        self.last_completed = 0.0
        self.done = threading.Event()

    def __call__(self, now: float, event: SSEEvent) -> None:
        if event.type == "agent.spawned":
            self.live += 1
            self.peak = max(self.peak, self.live)
            if self.first_spawn is None:
                self.first_spawn = now
        elif event.type in ("agent.completed", "agent.failed", "agent.stopped"):
            self.live -= 1
            if event.type == "agent.completed":
                self.completed += 1
                self.last_completed = now
            else:
                self.failed.append(event.data)
        elif event.type == "task.start_failed":
            self.start_failures.append(event.data)
        if self.completed >= self.expect or self.failed:
            self.done.set()


def peak_processes(runs_dir: Path) -> int:
    """Most agent processes alive at once, from each run's ``agent.json`` ``startedAt`` to
    its ``exit.json`` ``endedAt`` (both written by the shim). Events overstate it: a slot is
    free from the agent's exit, before its work is committed and ``agent.completed`` is
    published (as ``tests/test_core_loop.py`` measures it)."""
    spans = []
    for run in runs_dir.iterdir():
        try:
            began = json.loads((run / "agent.json").read_text())["startedAt"]
            ended = json.loads((run / "exit.json").read_text())["endedAt"]
        except (OSError, ValueError, KeyError):
            continue
        spans.append((float(began), float(ended)))
    return max((sum(1 for s, e in spans if s <= start < e) for start, _ in spans), default=0)


def _gridd(tasks: int) -> dict[str, Any]:
    agents = {"trivial": {"command": TRIVIAL_AGENT}}
    tally = _Tally(tasks)
    types = [
        "agent.spawned",
        "agent.completed",
        "agent.failed",
        "agent.stopped",
        "task.start_failed",
    ]
    with (
        agent_daemon(agents, default_agent="trivial") as daemon,
        RawHTTP(daemon.sock, timeout=60) as http,
        EventTap(daemon.sock, types=types, on_event=tally),
    ):
        plan = {"tasks": [{"id": f"t{i}", "title": f"task {i}"} for i in range(tasks)]}
        api(http, "POST", "/plans", plan)
        daemon_proc = psutil.Process(daemon.pid)
        cpu0 = daemon_proc.cpu_times()
        busy0 = machine_busy()
        started = time.monotonic()
        api(http, "POST", "/session/start", {"maxAgents": MAX_AGENTS})
        finished = tally.done.wait(TIMEOUT_S)
        elapsed = (tally.last_completed or time.monotonic()) - started
        cpu1 = daemon_proc.cpu_times()
        daemon_cpu = cpu1.user + cpu1.system - cpu0.user - cpu0.system
        children_cpu = sum(cpu1[2:4]) - sum(cpu0[2:4])
        machine_cpu = machine_busy() - busy0
        stats = api(http, "GET", "/state")["stats"]
        peak = peak_processes(daemon.root / ".grid" / "runs")
    if tally.failed:
        raise RuntimeError(f"{len(tally.failed)} run(s) failed, first: {tally.failed[0]}")
    return {
        "finished": finished and tally.completed == tasks,
        "completed": tally.completed,
        "seconds": elapsed,
        "first_spawn_s": None if tally.first_spawn is None else tally.first_spawn - started,
        "peak_agents": peak,
        # Spawned and not yet completed (committed) at once: more than maxAgents while
        # finishes overlap new starts, by design.
        "peak_unfinished": tally.peak,
        # The daemon's own CPU (user + system) over the run; shims and git are not in it.
        "daemon_cpu_s": round(daemon_cpu, 2),
        # Processes the daemon waited for: git, and the launchers that fork the shims.
        "git_cpu_s": round(children_cpu, 2),
        # Every process on the machine (daemon, shims, git, agents, this benchmark).
        "machine_cpu_s": round(machine_cpu, 2),
        "in_review": stats.get("review", 0),
        "start_failures": len(tally.start_failures),
        "start_failure_sample": [f["error"][:200] for f in tally.start_failures[:3]],
    }


def run(quick: bool) -> dict[str, Any]:
    tasks = TASKS_QUICK if quick else TASKS
    base_runs: list[dict[str, float]] = []
    gridd_runs: list[dict[str, Any]] = []
    for _ in range(ROUNDS):
        base_runs.append(asyncio.run(_baseline(tasks)))
        gridd_runs.append(_gridd(tasks))
    fastest = min(base_runs, key=lambda b: b["seconds"])
    base_s = fastest["seconds"]
    gridd = min(gridd_runs, key=lambda g: float(g["seconds"]))
    ratio = gridd["seconds"] / base_s
    return result(
        name=NAME,
        title=f"throughput: {tasks} trivial tasks, maxAgents={MAX_AGENTS}",
        checks=[
            Check(
                metric=f"{tasks} tasks: session start -> all in review",
                value=round(gridd["seconds"], 2),
                unit="s",
                target=f"<= {TARGET_RATIO:g} x baseline ({TARGET_RATIO * base_s:.1f} s)",
                passed=gridd["finished"] and ratio <= TARGET_RATIO,
            ),
            Check(
                metric="peak live agents",
                value=gridd["peak_agents"],
                unit="",
                target=f"<= {MAX_AGENTS}",
                passed=gridd["peak_agents"] <= MAX_AGENTS,
            ),
        ],
        baseline={
            "what": f"asyncio script, semaphore of {MAX_AGENTS}: worktree add -b, agent,"
            " commit if dirty, diff --name-only",
            "value": round(base_s, 2),
            "unit": "s",
            "tasks_per_s": round(tasks / base_s, 1),
            "rounds_s": [round(b["seconds"], 2) for b in base_runs],
            "machine_cpu_s": round(fastest["machine_cpu_s"], 2),
        },
        ratio=ratio,
        ratio_label="gridd wall time / baseline wall time",
        figures={
            "tasks": tasks,
            "gridd": {**gridd, "tasks_per_s": round(tasks / gridd["seconds"], 1)},
            "gridd_rounds_s": [round(g["seconds"], 2) for g in gridd_runs],
        },
        quick=quick,
        summary=f"gridd {gridd['seconds']:.1f} s ({tasks / gridd['seconds']:.1f} tasks/s, peak"
        f" {gridd['peak_agents']} agents); asyncio script {base_s:.1f} s"
        f" ({tasks / base_s:.1f} tasks/s); ratio {ratio:.2f}",
    )
