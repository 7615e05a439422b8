"""Spawn latency with the sandbox against without it, in the same daemon and run.

One real daemon serves a fresh repository with profiles running the same trivial agent
(``bench_spawn.TRIVIAL_AGENT``: one file written in its worktree): ``open`` (no sandbox),
``boxed`` (``[agents.boxed.sandbox] mode = "workspace"``: Landlock applied by the shim's
child before ``exec``, with a rule per entry of each directory on the hidden paths' ancestor
chains: the spare ruleset the shim server made after the previous such run, checked against
those directories, or one built from nothing when there is none or it is stale) and, where
Landlock has TCP rules (ABI 4), ``fenced`` (the same with ``network = "allowlist"``: its
filtering proxy opened by the daemon, its port in the ruleset). Spawns go round the
profiles, one at a time, each left to complete before the next: the clock
runs from ``POST /tasks/{id}/start`` to that task's ``agent.spawned`` at an SSE client, as in
``bench_spawn``.

A ``boxed`` spawn includes the run's own repository (``git/private.py``: made in its
worktree's ``.git`` after the run is recorded, before its process starts). Its steps are
also timed alone, in-process, on a repository of 200 files: making it (from the spare made
ahead, as the daemon does), reclaiming it when
the agent committed nothing (the finish's cost then) and when it made one commit (a fetch),
with ``git clone --shared --no-checkout`` of the same repository beside them, the
equivalent the in-process one stands for.

Baseline: the ``open`` spawns. Target: the ``boxed`` median, and the ``fenced`` one, <= 1.2 x
the ``open`` median.
Skipped (no figures) on a kernel without Landlock.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    Check,
    RawHTTP,
    latency_baseline,
    median,
    ms_summary,
    result,
    temp_repo,
)
from bench.harness import TRIVIAL_AGENT, EventTap, agent_daemon, api, of_task
from gridd.git.private import PrivateRepos
from gridd.git.worktrees import Worktrees
from gridd.runs import landlock

NAME = "sandbox"
RUNS = 16
RUNS_QUICK = 6
TARGET_RATIO = 1.2


def _spawns(runs: int, *, network: bool) -> dict[str, list[float]]:
    agents: dict[str, dict[str, Any]] = {
        "open": {"command": TRIVIAL_AGENT},
        "boxed": {"command": TRIVIAL_AGENT, "sandbox": {"mode": "workspace"}},
    }
    if network:  # its proxy opened, its port in the ruleset's TCP rules
        agents["fenced"] = {
            "command": TRIVIAL_AGENT,
            "sandbox": {
                "mode": "workspace",
                "network": "allowlist",
                "allow_hosts": ["example.invalid"],
            },
        }
    profiles = list(agents)
    latencies: dict[str, list[float]] = {p: [] for p in profiles}
    types = ["agent.spawned", "agent.completed", "agent.failed", "task.start_failed"]
    with (
        agent_daemon(agents, default_agent="open") as daemon,
        RawHTTP(daemon.sock, timeout=10) as http,
        EventTap(daemon.sock, types=types) as tap,
    ):
        # Round-robin; the first of each profile is a warm-up.
        order = [profiles[n % len(profiles)] for n in range(len(profiles) * (runs + 1))]
        tasks = [{"id": f"s{n}", "title": f"s{n}", "agent": p} for n, p in enumerate(order)]
        api(http, "POST", "/tasks", tasks)
        for n, task in enumerate(tasks):
            started = time.monotonic()
            api(http, "POST", f"/tasks/{task['id']}/start")
            arrived, event = tap.expect(of_task(task["id"]), timeout=30)
            if event.type != "agent.spawned":
                raise RuntimeError(f"{task['id']}: {event.type} {event.data}")
            if n >= len(profiles):
                latencies[task["agent"]].append(arrived - started)
            _, done = tap.expect(of_task(task["id"]), timeout=30)
            if done.type != "agent.completed":
                raise RuntimeError(f"{task['id']}: {done.type} {done.data}")
    return latencies


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


async def _private_repo_steps(runs: int) -> dict[str, list[float]]:
    """Seconds per step of a run's own repository, and per ``git clone --shared``."""
    steps: dict[str, list[float]] = {"make": [], "reclaim": [], "reclaim_commit": [], "clone": []}
    with temp_repo() as root:
        for n in range(200):
            (root / f"f{n}.txt").write_text(f"{n}\n")
        _git(root, "add", ".")
        _git(root, "-c", "user.name=bench", "-c", "user.email=b@x", "commit", "-q", "-m", "files")
        worktrees = Worktrees(root, root / ".grid" / "worktrees")
        await worktrees.setup()
        tree = await worktrees.create("t1", None)
        private = PrivateRepos(worktrees)
        await private.make(tree.path, agent_id="warm-up")  # git init's config, asked once
        await private.reclaim(tree.path)
        for n in range(runs):
            for step, commit in (("reclaim", False), ("reclaim_commit", True)):
                started = time.perf_counter()
                await private.make(tree.path, agent_id=f"b-{n}")
                steps["make"].append(time.perf_counter() - started)
                if commit:
                    (tree.path / f"n{n}.txt").write_text("new\n")
                    _git(tree.path, "add", f"n{n}.txt")
                    who = ("-c", "user.name=bench", "-c", "user.email=b@x")
                    _git(tree.path, *who, "commit", "-q", "-m", f"agent {n}")
                started = time.perf_counter()
                await private.reclaim(tree.path)
                steps[step].append(time.perf_counter() - started)
                await private.prepare()  # the next one's spare, as the daemon makes it
        with tempfile.TemporaryDirectory(prefix="gbclone") as d:
            for n in range(runs):
                started = time.perf_counter()
                subprocess.run(
                    ["git", "clone", "-q", "--shared", "--no-checkout", str(root), f"{d}/{n}"],
                    check=True,
                    capture_output=True,
                )
                steps["clone"].append(time.perf_counter() - started)
    return steps


def run(quick: bool) -> dict[str, Any]:
    runs = RUNS_QUICK if quick else RUNS
    abi = landlock.abi_version()
    if abi < 1:
        return result(
            name=NAME,
            title="spawn latency in a sandbox: skipped, this kernel offers no Landlock",
            checks=[],
            baseline={},
            ratio=None,
            ratio_label="",
            figures={"landlock_abi": abi},
            quick=quick,
        )
    spawns = _spawns(runs, network=abi >= landlock.NET_ABI)
    steps = asyncio.run(_private_repo_steps(runs))
    open_ms = median(spawns["open"]) * 1000
    boxed_ms = median(spawns["boxed"]) * 1000
    ratio = boxed_ms / open_ms
    checks = [
        Check(
            metric=f"median sandboxed spawn latency ({runs} spawns)",
            value=round(boxed_ms, 2),
            unit="ms",
            target=f"<= {TARGET_RATIO:g} x unsandboxed ({TARGET_RATIO * open_ms:.1f} ms)",
            passed=ratio <= TARGET_RATIO,
        )
    ]
    fenced = ""
    if spawns.get("fenced"):
        fenced_ms = median(spawns["fenced"]) * 1000
        checks.append(
            Check(
                metric=f"median spawn latency, network allowlist ({runs} spawns)",
                value=round(fenced_ms, 2),
                unit="ms",
                target=f"<= {TARGET_RATIO:g} x unsandboxed ({TARGET_RATIO * open_ms:.1f} ms)",
                passed=fenced_ms / open_ms <= TARGET_RATIO,
            )
        )
        fenced = f", with network allowlist {fenced_ms:.1f} ms ({fenced_ms / open_ms:.2f})"
    return result(
        name=NAME,
        title="spawn latency with the sandbox (workspace mode) against without it",
        checks=checks,
        baseline=latency_baseline("the same agent, sandbox off, same daemon", spawns["open"]),
        ratio=ratio,
        ratio_label="sandboxed median / unsandboxed median",
        figures={
            "runs": runs,
            "landlock_abi": abi,
            "sandboxed_ms": ms_summary(spawns["boxed"]),
            "network_allowlist_ms": ms_summary(spawns["fenced"]) if fenced else None,
            "agent": TRIVIAL_AGENT,
            "private_repo_make_ms": ms_summary(steps["make"]),
            "private_repo_reclaim_nothing_new_ms": ms_summary(steps["reclaim"]),
            "private_repo_reclaim_one_commit_ms": ms_summary(steps["reclaim_commit"]),
            "git_clone_shared_no_checkout_ms": ms_summary(steps["clone"]),
        },
        quick=quick,
        summary=f"sandboxed median {boxed_ms:.1f} ms, unsandboxed {open_ms:.1f} ms;"
        f" ratio {ratio:.2f}{fenced}; the run's own repository: made in"
        f" {median(steps['make']) * 1000:.1f} ms (git clone --shared:"
        f" {median(steps['clone']) * 1000:.1f} ms), reclaimed in"
        f" {median(steps['reclaim_commit']) * 1000:.1f} ms with a commit to fetch",
        notes="spawns go round the profiles, one at a time, each run left to complete; the"
        " first of each is a warm-up and not counted (for a sandboxed profile, the one run"
        " that finds no spare ruleset: landlock_rules.Spare). A sandboxed spawn makes the run's own"
        " repository (git/private.py); its steps are timed alone in-process",
    )
