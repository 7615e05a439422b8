"""Spawn latency with the sandbox against without it, in the same daemon and run.

One real daemon serves a fresh repository with profiles running the same trivial agent
(``bench_spawn.TRIVIAL_AGENT``: one file written in its worktree): ``open`` (no sandbox),
``boxed`` (``[agents.boxed.sandbox] mode = "workspace"``: Landlock applied by the shim's
child before ``exec``, after planning the rules down the hidden paths' ancestors) and, where
Landlock has TCP rules (ABI 4), ``fenced`` (the same with ``network = "allowlist"``: its
filtering proxy opened by the daemon, its port in the ruleset). Spawns go round the
profiles, one at a time, each left to complete before the next: the clock
runs from ``POST /tasks/{id}/start`` to that task's ``agent.spawned`` at an SSE client, as in
``bench_spawn``.

Baseline: the ``open`` spawns. Target: the ``boxed`` median, and the ``fenced`` one, <= 1.2 x
the ``open`` median.
Skipped (no figures) on a kernel without Landlock.
"""

from __future__ import annotations

import time
from typing import Any

from bench.bench_spawn import TRIVIAL_AGENT, EventTap, _of_task, agent_daemon, api
from bench.common import Check, RawHTTP, latency_baseline, median, ms_summary, result
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
            arrived, event = tap.expect(_of_task(task["id"]), timeout=30)
            if event.type != "agent.spawned":
                raise RuntimeError(f"{task['id']}: {event.type} {event.data}")
            if n >= len(profiles):
                latencies[task["agent"]].append(arrived - started)
            _, done = tap.expect(_of_task(task["id"]), timeout=30)
            if done.type != "agent.completed":
                raise RuntimeError(f"{task['id']}: {done.type} {done.data}")
    return latencies


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
        },
        quick=quick,
        summary=f"sandboxed median {boxed_ms:.1f} ms, unsandboxed {open_ms:.1f} ms;"
        f" ratio {ratio:.2f}{fenced}",
        notes="spawns go round the profiles, one at a time, each run left to complete; the"
        " first of each is a warm-up and not counted",
    )
