"""Bead to agent: a bead becomes ready in bd -> ``agent.spawned`` received by an SSE client.

A real daemon serves a fresh repository with ``.beads/`` and the strict ``bd`` stand-in
(``tests/fakes/bd``, run as ``python -I -S``) as its beads command, the poll off
(``poll_seconds = 0``) so only the watch of ``.beads/`` can notice, and a session running
with room to spare. For each of N beads (12; 5 with ``--quick``), one at a time: the bead is
written into bd's data (an atomic rename, as a database commit lands), and the clock stops
when a raw ``GET /events`` reader sees that task's ``agent.spawned``. The run completes, its
review is written back to bd and 0.3 s pass before the next bead is written (each bead is
measured alone, as ``bench_spawn`` measures each task alone).

On the way gridd notices the change (watchfiles), runs ``bd ready --json --limit 0``, adds
the task, wakes its scheduler, creates the worktree, launches the shim and publishes; the
claim (``bd update <id> --claim --json``) runs beside the worktree and the spawn, and the
agent's finish waits for its answer (a lost claim stops the agent and commits nothing).

Baseline (same run, another fresh repository, same ``bd``): a plain script doing the work
that cannot be skipped, in series: ``bd ready``, ``bd update --claim``, ``git worktree add
-b``, ``Popen`` of the same agent, until ``Popen`` returns. Targets: gridd's median
<= 150 ms, and the ratio to the baseline is reported (the two ``bd`` starts dominate both).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.baselines import git_env
from bench.beads_data import BD, add_bead, beads_repo
from bench.common import (
    Check,
    RawHTTP,
    latency_baseline,
    median,
    ms_summary,
    remove_repo,
    result,
    running_gridd,
    wait_until,
)
from bench.harness import TRIVIAL_AGENT, EventTap, api, kill_agents, stop_session, write_config

NAME = "beads"
RUNS = 12
RUNS_QUICK = 5
TARGET_MS = 150.0
SETTLE_S = 0.3


def _in_review(root: Path, bead_id: str) -> bool:
    db = json.loads((root / ".beads" / "fake-bd.json").read_text())
    issue = next((i for i in db["issues"] if i["id"] == bead_id), {})
    return "gridd:review" in (issue.get("labels") or [])


def _bd(root: Path, *args: str) -> str:
    return subprocess.run([*BD, *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _baseline(runs: int) -> list[float]:
    root = beads_repo()
    env = git_env()
    try:
        (root / ".git" / "info" / "exclude").write_text(".grid/\n.beads/\n")
        wt_dir = root / ".grid" / "worktrees"
        wt_dir.mkdir(parents=True)
        times = []
        for i in range(runs):
            bead_id = f"b-{i}"
            add_bead(root, bead_id)
            started = time.perf_counter()
            ready = json.loads(_bd(root, "ready", "--json", "--limit", "0"))
            assert any(b["id"] == bead_id for b in ready)
            _bd(root, "update", bead_id, "--claim", "--json")
            path = wt_dir / bead_id
            subprocess.run(
                ["git", "worktree", "add", "-q", "-b", f"grid/{bead_id}", "--", str(path)],
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
                env={**env, "GRID_TASK_ID": bead_id},
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            times.append(time.perf_counter() - started)
            proc.wait()
        return times
    finally:
        remove_repo(root)


def _gridd(runs: int) -> list[float]:
    root = beads_repo()
    types = ["agent.spawned", "agent.completed", "agent.failed", "task.start_failed"]
    latencies: list[float] = []
    try:
        write_config(root, agents={"trivial": {"command": TRIVIAL_AGENT}}, default_agent="trivial")
        config = root / ".grid" / "config.toml"
        config.write_text(
            config.read_text()
            + f"\n[beads]\nenabled = true\ncommand = {json.dumps(BD)}\npoll_seconds = 0\n"
        )
        with (
            running_gridd(root) as daemon,
            RawHTTP(daemon.sock, timeout=10) as http,
            EventTap(daemon.sock, types=types) as tap,
        ):
            api(http, "POST", "/session/start", {"featureBranch": "beads-bench", "maxAgents": 4})
            try:
                for n in range(runs + 1):  # the first is a warm-up
                    bead_id = f"g-{n}"
                    started = time.monotonic()
                    add_bead(root, bead_id)
                    arrived, event = tap.expect(
                        lambda e, b=bead_id: e.data.get("taskId") == b, timeout=30
                    )
                    if event.type != "agent.spawned":
                        raise RuntimeError(f"{bead_id}: {event.type} {event.data}")
                    if n:
                        latencies.append(arrived - started)
                    _, done = tap.expect(lambda e, b=bead_id: e.data.get("taskId") == b, timeout=30)
                    if done.type != "agent.completed":
                        raise RuntimeError(f"{bead_id}: {done.type} {done.data}")
                    # Each bead measured alone: its review is written back to bd, and the
                    # bd ready that this write wakes has run, before the next bead lands.
                    wait_until(lambda b=bead_id: _in_review(root, b), timeout=30)
                    time.sleep(SETTLE_S)
            finally:
                stop_session(daemon.sock)
        return latencies
    finally:
        kill_agents(root)
        remove_repo(root)


def run(quick: bool) -> dict[str, Any]:
    runs = RUNS_QUICK if quick else RUNS
    base = _baseline(runs)
    gridd = _gridd(runs)
    base_ms, gridd_ms = median(base) * 1000, median(gridd) * 1000
    ratio = gridd_ms / base_ms
    return result(
        name=NAME,
        title="bead to agent: a bead ready in bd -> agent.spawned at an SSE client",
        checks=[
            Check(
                metric=f"median bead -> agent.spawned ({runs} beads)",
                value=round(gridd_ms, 2),
                unit="ms",
                target=f"<= {TARGET_MS:g} ms",
                passed=gridd_ms <= TARGET_MS,
            )
        ],
        baseline=latency_baseline(
            "bd ready + bd update --claim + git worktree add -b + Popen, in series", base
        ),
        ratio=ratio,
        ratio_label="gridd median / baseline median",
        figures={
            "runs": runs,
            "gridd_ms": ms_summary(gridd),
            "bd": "tests/fakes/bd under python -I -S",
        },
        quick=quick,
        summary=f"median {gridd_ms:.1f} ms (min {min(gridd) * 1000:.1f}, max"
        f" {max(gridd) * 1000:.1f}); the same bd + git + Popen in series {base_ms:.1f} ms;"
        f" ratio {ratio:.2f}",
        notes="the poll is off: only the watch of .beads/ can see a new bead",
    )
