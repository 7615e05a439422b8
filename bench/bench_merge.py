"""Merge queue and conflict radar: what bringing work together costs.

1. **Merge queue.** 20 tasks (the trivial agent writes one file each, its own) run to review
   on a feature branch; then all 20 are approved at once (20 ``POST .../approve`` back to
   back). The clock runs from the first approval to the 20th ``task.merged`` seen by a raw
   SSE reader: the queue drained, one merge at a time, each a ``--no-ff`` merge in the
   integration worktree and a compare-and-swap ``update-ref``. Baseline, same run, another
   fresh repository with the same 20 one-file branches: a plain shell-like script doing, per
   branch, ``rev-parse F``, ``reset --hard`` of a detached worktree to it, ``merge --no-ff``,
   ``rev-parse HEAD``, ``update-ref F new old``. Target: time per merge <= 1.5 x baseline.
   Two rounds each (baseline first); the fastest of each are compared.
2. **Radar at idle.** A 5,000-file repository, 8 tasks in review (8 live worktrees), the
   radar sweeping every 3 s: the daemon's CPU (its own plus the git processes it waited for)
   over an idle window, as a share of one core. Baseline, same run: the same workspace with
   the radar slowed to one sweep an hour. Target: the radar's share <= 5 % of a core (the
   figure reported is the daemon's whole idle CPU, radar included).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.baselines import FEATURE, git, merge_script_seconds
from bench.common import Check, RawHTTP, make_repo, remove_repo, result, running_gridd
from bench.harness import (
    TRIVIAL_AGENT,
    EventTap,
    agent_daemon,
    api,
    kill_agents,
    stop_session,
    write_config,
)
from gridd.client import SSEEvent

NAME = "merge"
TASKS = 20
ROUNDS = 2
TARGET_RATIO = 1.5
RADAR_TARGET = 0.05
RADAR_FILES = 5000
RADAR_TASKS = 8
IDLE_WINDOW_S = 33.0  # more than one quiet re-read (10 sweeps of 3 s)
IDLE_WINDOW_QUICK_S = 12.0
TIMEOUT_S = 300.0


# -- baseline ------------------------------------------------------------------------------------


# -- gridd -----------------------------------------------------------------------------------------


class _Merged:
    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.reviewed = 0
        self.merged = 0
        self.last = 0.0
        self.trouble: list[dict[str, Any]] = []
        self.in_review = threading.Event()
        self.done = threading.Event()

    def __call__(self, now: float, event: SSEEvent) -> None:
        if event.type == "agent.completed":
            self.reviewed += 1
            if self.reviewed >= self.expect:
                self.in_review.set()
        elif event.type == "task.merged":
            self.merged += 1
            self.last = now
            if self.merged >= self.expect:
                self.done.set()
        else:
            self.trouble.append({"type": event.type, **event.data})
            self.in_review.set()
            self.done.set()


def _gridd(tasks: int) -> dict[str, Any]:
    tally = _Merged(tasks)
    types = [
        "agent.completed",
        "task.merged",
        "agent.failed",
        "task.merge_conflict",
        "task.merge_retry",
    ]
    agents = {"trivial": {"command": TRIVIAL_AGENT}}
    with (
        agent_daemon(agents, default_agent="trivial") as daemon,
        RawHTTP(daemon.sock, timeout=60) as http,
        EventTap(daemon.sock, types=types, on_event=tally),
    ):
        api(
            http,
            "POST",
            "/plans",
            {"tasks": [{"id": f"t{i}", "title": f"t{i}"} for i in range(tasks)]},
        )
        api(http, "POST", "/session/start", {"featureBranch": FEATURE, "maxAgents": 8})
        if not tally.in_review.wait(TIMEOUT_S) or tally.trouble:
            raise RuntimeError(f"tasks did not reach review: {tally.trouble[:2]}")
        started = time.monotonic()
        for i in range(tasks):
            api(http, "POST", f"/tasks/t{i}/approve")
        approved = time.monotonic() - started
        finished = tally.done.wait(TIMEOUT_S)
        if tally.trouble:
            raise RuntimeError(f"merge trouble: {tally.trouble[:2]}")
        elapsed = tally.last - started
    return {"finished": finished, "per_merge_s": elapsed / tasks, "approve_all_s": approved}


def _big_repo() -> Path:
    root = make_repo()
    for d in range(RADAR_FILES // 100):
        folder = root / "src" / f"d{d}"
        folder.mkdir(parents=True)
        for f in range(100):
            (folder / f"f{f}.py").write_text(f"# file {d}/{f}\nVALUE = {d * 100 + f}\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", f"{RADAR_FILES} files")
    return root


def _radar_idle(radar_seconds: float, window: float) -> dict[str, Any]:
    """The daemon's CPU share over an idle window with 8 live worktrees of a big repo."""
    tally = _Merged(RADAR_TASKS)
    root = _big_repo()
    try:
        write_config(root, agents={"trivial": {"command": TRIVIAL_AGENT}}, default_agent="trivial")
        with (root / ".grid" / "config.toml").open("a") as fh:
            fh.write(f"\n[merge]\nradar_seconds = {radar_seconds}\n")
        with (
            running_gridd(root) as daemon,
            RawHTTP(daemon.sock, timeout=60) as http,
            EventTap(daemon.sock, types=["agent.completed", "agent.failed"], on_event=tally),
        ):
            plan = [{"id": f"r{i}", "title": f"r{i}"} for i in range(RADAR_TASKS)]
            api(http, "POST", "/plans", {"tasks": plan})
            api(http, "POST", "/session/start", {"featureBranch": FEATURE, "maxAgents": 8})
            if not tally.in_review.wait(TIMEOUT_S) or tally.trouble:
                raise RuntimeError(f"tasks did not reach review: {tally.trouble[:2]}")
            time.sleep(4.0)  # the first sweeps read every worktree once
            proc = psutil.Process(daemon.pid)
            cpu0 = proc.cpu_times()
            time.sleep(window)
            cpu1 = proc.cpu_times()
            stop_session(daemon.sock)
    finally:
        kill_agents(root)
        remove_repo(root)
    used = sum(cpu1[:4]) - sum(cpu0[:4])  # user, system, and the children it waited for
    return {"cpu_s": round(used, 3), "window_s": window, "core_share": used / window}


def run(quick: bool) -> dict[str, Any]:
    base_runs: list[float] = []
    gridd_runs: list[dict[str, Any]] = []
    for _ in range(ROUNDS):
        base_runs.append(merge_script_seconds(TASKS))
        gridd_runs.append(_gridd(TASKS))
    base = min(base_runs)
    gridd = min(gridd_runs, key=lambda g: float(g["per_merge_s"]))
    ratio = gridd["per_merge_s"] / base
    window = IDLE_WINDOW_QUICK_S if quick else IDLE_WINDOW_S
    radar_off = _radar_idle(3600.0, window)
    radar_on = _radar_idle(3.0, window)
    radar_share = max(0.0, radar_on["core_share"] - radar_off["core_share"])
    return result(
        name=NAME,
        title=f"merge queue: {TASKS} approved at once; radar: {RADAR_TASKS} live worktrees",
        checks=[
            Check(
                metric=f"per merge, {TASKS} approved at once",
                value=round(gridd["per_merge_s"] * 1000, 1),
                unit="ms",
                target=f"<= {TARGET_RATIO:g} x baseline ({TARGET_RATIO * base * 1000:.0f} ms)",
                passed=bool(gridd["finished"]) and ratio <= TARGET_RATIO,
            ),
            Check(
                metric=f"radar at idle, {RADAR_TASKS} worktrees of {RADAR_FILES} files",
                value=round(radar_share * 100, 2),
                unit="% of a core",
                target=f"<= {RADAR_TARGET * 100:g} %",
                passed=radar_share <= RADAR_TARGET,
            ),
        ],
        baseline={
            "what": "plain script per merge: rev-parse F, reset --hard, merge --no-ff,"
            " rev-parse HEAD, update-ref F new old",
            "value": round(base * 1000, 1),
            "unit": "ms per merge",
            "rounds_ms": [round(b * 1000, 1) for b in base_runs],
            "radar_off_core_share": round(radar_off["core_share"], 4),
        },
        ratio=ratio,
        ratio_label="gridd per-merge time / plain script per-merge time",
        figures={
            "gridd_rounds_ms": [round(g["per_merge_s"] * 1000, 1) for g in gridd_runs],
            "approve_all_s": round(gridd["approve_all_s"], 3),
            "radar_on": radar_on,
            "radar_off": radar_off,
        },
        quick=quick,
        summary=f"{gridd['per_merge_s'] * 1000:.0f} ms per merge vs {base * 1000:.0f} ms for a"
        f" plain script (ratio {ratio:.2f}); daemon idle CPU {radar_on['core_share'] * 100:.2f}"
        f" % of a core with the radar, {radar_off['core_share'] * 100:.2f} % without",
    )
