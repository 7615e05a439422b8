"""Waves: 20 tasks of a 0.3 s agent on 4 slots, through ``POST /tasks`` and through beads.

The agent writes one file in its worktree and sleeps 0.3 s, so the floor is 5 waves x 0.3 s
= 1.5 s plus one ``git worktree add`` and one commit per task. Four runs, each in a fresh
repository with a session already started (``maxAgents`` 4):

- **baseline**: a plain asyncio script with a semaphore of 4 doing the same git work and
  process starts per task (``git worktree add -b``, the agent, ``git add -A``, ``git commit``,
  ``git diff --name-only``; its worktree adds one at a time, as concurrent adds race);
- **gridd, POST /tasks**: the clock starts when the 20 tasks are posted in one request and
  stops when a raw SSE reader has seen the 20th ``agent.completed`` (work committed, task in
  review);
- **gridd, POST /tasks, nothing prepared**: the same with ``[scheduler] prepare_ahead = 0``
  (every ``git worktree add`` on the critical path), to show what preparing worktrees saves;
- **gridd, beads**: the same, but the 20 beads land in bd's data in one atomic write (the
  strict ``bd`` stand-in, ``python -I -S tests/fakes/bd``, watch on, poll off); each bead is
  claimed in bd (the next ones ahead of a free slot, ``[beads] claim_ahead``), and review is
  written back (the same write to several beads in one ``bd update``).

Targets: <= 2.5 s through ``POST /tasks``, <= 3 s through beads; the ratio to the baseline
shows what gridd itself adds.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from bench.baselines import GIT_IDENTITY, git_async, git_env
from bench.beads_data import BD, add_beads, beads_repo
from bench.common import Check, RawHTTP, make_repo, remove_repo, result, running_gridd
from bench.harness import (
    AgentTally,
    EventTap,
    api,
    kill_agents,
    peak_processes,
    stop_session,
    write_config,
)

NAME = "waves"
TASKS = 20
SLOTS = 4
AGENT_SECONDS = 0.3
TARGET_API_S = 2.5
TARGET_BEADS_S = 3.0
AGENT = [
    "/bin/sh",
    "-c",
    f'echo "work for $GRID_TASK_ID" > "$GRID_TASK_ID.txt"; sleep {AGENT_SECONDS}',
]
TYPES = ["agent.spawned", "agent.completed", "agent.failed", "agent.stopped", "task.start_failed"]


async def _baseline(tasks: int) -> float:
    root = make_repo()
    env = git_env()
    try:
        (root / ".git" / "info" / "exclude").write_text(".grid/\n")
        wt_dir = root / ".grid" / "worktrees"
        wt_dir.mkdir(parents=True)
        base = (await git_async(root, "rev-parse", "HEAD", env=env)).strip()
        sem = asyncio.Semaphore(SLOTS)
        add_lock = asyncio.Lock()

        async def one(i: int) -> None:
            task_id = f"b{i}"
            path = wt_dir / task_id
            async with sem:
                async with add_lock:
                    await git_async(
                        root, "worktree", "add", "-q", "-b", f"grid/{task_id}", "--",
                        str(path), base, env=env,
                    )  # fmt: skip
                agent = await asyncio.create_subprocess_exec(
                    *AGENT,
                    cwd=str(path),
                    env={**env, "GRID_TASK_ID": task_id},
                    stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True,
                )
                if await agent.wait() != 0:
                    raise RuntimeError(f"agent {task_id} failed")
            await git_async(path, "add", "-A", "--", ".", env=env)
            await git_async(
                path, *GIT_IDENTITY, "commit", "-q", "--no-verify", "-m", task_id, env=env
            )
            await git_async(path, "diff", "--name-only", f"{base}..HEAD", "--", env=env)

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(tasks)))
        return time.monotonic() - started
    finally:
        remove_repo(root)


def _gridd(tasks: int, *, through_beads: bool, prepare_ahead: int | None = None) -> dict[str, Any]:
    root = beads_repo() if through_beads else make_repo()
    tally = AgentTally(tasks)
    try:
        scheduler = {} if prepare_ahead is None else {"prepare_ahead": prepare_ahead}
        write_config(
            root,
            agents={"sleepy": {"command": AGENT}},
            default_agent="sleepy",
            scheduler=scheduler,
        )
        if through_beads:
            config = root / ".grid" / "config.toml"
            config.write_text(
                config.read_text()
                + f"\n[beads]\nenabled = true\ncommand = {json.dumps(BD)}\npoll_seconds = 0\n"
            )
        with (
            running_gridd(root) as daemon,
            RawHTTP(daemon.sock, timeout=60) as http,
            EventTap(daemon.sock, types=TYPES, on_event=tally),
        ):
            try:
                api(http, "POST", "/session/start", {"featureBranch": "waves", "maxAgents": SLOTS})
                ids = [f"w{i}" for i in range(tasks)]
                started = time.monotonic()
                if through_beads:
                    add_beads(root, ids)
                else:
                    api(http, "POST", "/tasks", [{"id": i, "title": i} for i in ids])
                if not tally.done.wait(120):
                    raise RuntimeError(f"only {tally.completed} of {tasks} completed in time")
                if tally.failed:
                    raise RuntimeError(f"an agent failed: {tally.failed[0]}")
                return {
                    "seconds": tally.last_completed - started,
                    "peak_agents": peak_processes(root / ".grid" / "runs"),
                    "peak_unfinished": tally.peak,
                    "start_failures": len(tally.start_failures),
                }
            finally:
                stop_session(daemon.sock)
    finally:
        kill_agents(root)
        remove_repo(root)


def run(quick: bool) -> dict[str, Any]:
    base = asyncio.run(_baseline(TASKS))
    via_api = _gridd(TASKS, through_beads=False)
    via_beads = _gridd(TASKS, through_beads=True)
    # The same as via_api with no worktree prepared ahead: what preparing them saves.
    unprepared = _gridd(TASKS, through_beads=False, prepare_ahead=0)
    api_s, beads_s = via_api["seconds"], via_beads["seconds"]
    return result(
        name=NAME,
        title=f"{TASKS} tasks x {AGENT_SECONDS} s agent on {SLOTS} slots",
        checks=[
            Check(
                metric="through POST /tasks",
                value=round(api_s, 3),
                unit="s",
                target=f"<= {TARGET_API_S} s",
                passed=api_s <= TARGET_API_S,
            ),
            Check(
                metric="through beads",
                value=round(beads_s, 3),
                unit="s",
                target=f"<= {TARGET_BEADS_S} s",
                passed=beads_s <= TARGET_BEADS_S,
            ),
        ],
        baseline={
            "what": "asyncio script, semaphore of 4: worktree add, agent, add, commit, diff",
            "value": round(base, 3),
            "unit": "s",
        },
        ratio=api_s / base,
        ratio_label="gridd (POST /tasks) / baseline",
        figures={
            "api": via_api,
            "beads": via_beads,
            "api_unprepared": unprepared,
            "floor_s": TASKS / SLOTS * AGENT_SECONDS,
        },
        quick=quick,
        summary=f"POST /tasks {api_s:.2f} s, beads {beads_s:.2f} s, plain script {base:.2f} s"
        f" (floor {TASKS / SLOTS * AGENT_SECONDS:.1f} s); POST /tasks with no worktree"
        f" prepared ahead {unprepared['seconds']:.2f} s; peak agents {via_api['peak_agents']}"
        f"/{via_beads['peak_agents']}",
        notes="one run each (the figures are seconds, not rates); the session is started first",
    )
