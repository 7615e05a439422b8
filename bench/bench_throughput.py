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
import time
from typing import Any

import psutil

from bench.baselines import GIT_IDENTITY, git_async, git_env
from bench.common import Check, RawHTTP, make_repo, remove_repo, result
from bench.harness import TRIVIAL_AGENT, AgentTally, EventTap, agent_daemon, api, peak_processes

NAME = "throughput"
TASKS = 200
TASKS_QUICK = 50
MAX_AGENTS = 8
ROUNDS = 2
TARGET_RATIO = 1.5
TIMEOUT_S = 120.0


# -- baseline -------------------------------------------------------------------------------------


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
        base = (await git_async(root, "rev-parse", "HEAD", env=env)).strip()
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
                    await git_async(
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
                    await git_async(path, "status", "--porcelain", "--untracked-files=all", env=env)
                ).strip():
                    await git_async(path, "add", "-A", "--", ".", env=env)
                    await git_async(
                        path, *GIT_IDENTITY, "commit", "-q", "--no-verify", "-m", task_id, env=env
                    )
                await git_async(path, "diff", "--name-only", f"{base}..HEAD", "--", env=env)

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


def _gridd(tasks: int) -> dict[str, Any]:
    agents = {"trivial": {"command": TRIVIAL_AGENT}}
    tally = AgentTally(tasks)
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
