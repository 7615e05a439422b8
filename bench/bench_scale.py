"""Scale: 10,000 tasks in a random DAG, loaded by one plan; the idle scheduler pass and
``GET /state`` with all of them.

The plan (fixed seed): task ``s<i>`` depends on 0-3 tasks among the 500 before it, so about
a third are ready at once and there are 63 waves (topological levels); random priorities.

Two parts:

- **in-process** (the scheduler): gridd's real ``Grid`` (store, bus, pool, scheduler) on a
  throwaway workspace in this process, as ``bench_sse_fanout`` builds it, with one agent
  profile running ``sleep``. The plan is validated (``PlanSpec``) and loaded through
  ``Commands.create_tasks``; a session starts with ``maxAgents=8``, and once its 8 agents
  run, nothing changes: ``Scheduler.run_pass()`` is then timed 2,000 times (500 with
  ``--quick``), yielding to the event loop between passes as the real loop does (the 8
  agents' monitors keep polling in the same loop). Target: p99 <= 5 ms. Informational:
  ``run_pass(force=True)``, the full observe-plan-apply pass any state change triggers.
- **over the socket** (a real daemon, no session): the same plan by ``POST /plans`` (load
  time reported), then ``GET /state`` on one keep-alive connection (its 4.6 MB body read
  straight into a buffer), 50 times (20 quick) after 3 warm-ups. Target: p50 <= 20 ms.

Baseline (same run): ``json.dumps`` of the 10,000 task objects ``GET /state`` returned
(the least any server must do to send them); ratio = ``GET /state`` p50 / that.

Then **live agents** (``bench/scale_agents.py``): 16, 64 and 256 tiny tickers (16 and 64
with ``--quick``): daemon CPU at rest and at one line per second each, ``/state`` and
``/health`` p50/p99, write -> SSE event latency, PSS of the daemon and the shims, time to
start all and to recover all after ``kill -9`` of the daemon. Targets (at the largest
count): daemon <= 10 % of a core at 1 line/s, ``/state`` p50 <= 2 ms, write -> event p50
<= 20 ms, <= 1 % of a core at rest, recovery <= 3 s. Baseline: the daemon's CPU at rest
before any agent exists, and ``/health`` p50 for ``/state``.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from typing import Any

import psutil

from bench.common import (
    Check,
    RawHTTP,
    median,
    percentile,
    result,
    running_gridd,
    temp_repo,
)
from bench.harness import api
from bench.inprocess import busy_grid
from bench.scale_agents import measure

NAME = "scale"
TASKS = 10_000
MAX_AGENTS = 8
IDLE_PASSES = 2000
IDLE_PASSES_QUICK = 500
FORCED_PASSES = 20
FORCED_PASSES_QUICK = 5
STATE_GETS = 50
STATE_GETS_QUICK = 20
IDLE_P99_TARGET_MS = 5.0
AGENT_COUNTS = (16, 64, 256)
AGENT_COUNTS_QUICK = (16, 64)
TICKING_CPU_TARGET = 10.0
REST_CPU_TARGET = 1.0
AGENT_STATE_P50_TARGET_MS = 2.0
EVENT_P50_TARGET_MS = 20.0
RECOVER_TARGET_S = 3.0
STATE_P50_TARGET_MS = 20.0


def random_plan(n: int, *, seed: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        window = range(max(0, i - 500), i)
        k = min(len(window), rng.choice((0, 0, 1, 1, 2, 3)))
        deps = [f"s{j}" for j in sorted(rng.sample(window, k))]
        tasks.append(
            {
                "id": f"s{i}",
                "title": f"scale task {i}",
                "prompt": f"do part {i} of the work",
                "priority": rng.randint(0, 4),
                "dependsOn": deps,
            }
        )
    return tasks


def _ms(values: list[float], p: float) -> float:
    return round(percentile(values, p) * 1000, 3)


# -- in-process: the scheduler ---------------------------------------------------------------


async def _scheduler_part(plan: list[dict[str, Any]], *, idle: int, forced: int) -> dict[str, Any]:
    async with busy_grid(plan, max_agents=MAX_AGENTS) as (grid, timings):
        scheduler = grid.scheduler
        forced_times = []
        for _ in range(forced):
            t0 = time.perf_counter()
            scheduler.run_pass(force=True)
            forced_times.append(time.perf_counter() - t0)
            await asyncio.sleep(0.001)
        skipped_before = scheduler.idle_passes
        idle_times = []
        for _ in range(idle):
            t0 = time.perf_counter()
            scheduler.run_pass()
            idle_times.append(time.perf_counter() - t0)
            await asyncio.sleep(0.001)
        skipped = scheduler.idle_passes - skipped_before
        statuses: dict[str, int] = {}
        for task in grid.state.tasks.values():
            statuses[task.status.value] = statuses.get(task.status.value, 0) + 1
        return {
            **timings,
            "statuses": statuses,
            "idle_passes": idle,
            "idle_passes_skipped": skipped,  # passes that found nothing changed
            "idle_ms": {
                "p50": _ms(idle_times, 50),
                "p99": _ms(idle_times, 99),
                "max": _ms(idle_times, 100),
            },
            "idle_p99_s": percentile(idle_times, 99),
            "forced_ms": {
                "p50": _ms(forced_times, 50),
                "max": _ms(forced_times, 100),
            },
        }


# -- over the socket: a real daemon ----------------------------------------------------------------


def _get(sock: socket.socket, request: bytes) -> tuple[int, bytearray]:
    """One keep-alive request whose (multi-megabyte) body is read straight into a buffer
    of its Content-Length. ``RawHTTP`` grows a ``bytes`` object chunk by chunk, which for a
    4.6 MB body costs the client ~20 ms of copying and would be counted against gridd."""
    sock.sendall(request)
    head = bytearray()
    while (end := head.find(b"\r\n\r\n")) < 0:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        head += data
    lower = bytes(head[:end]).lower()
    at = lower.find(b"content-length:")
    length = int(lower[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
    body = bytearray(length)
    view = memoryview(body)
    have = min(length, len(head) - end - 4)
    view[:have] = head[end + 4 : end + 4 + have]
    while have < length:
        n = sock.recv_into(view[have:], length - have)
        if not n:
            raise ConnectionError("server closed the connection mid-body")
        have += n
    return int(head[9:12]), body


def _daemon_part(plan: list[dict[str, Any]], *, gets: int) -> dict[str, Any]:
    with (
        temp_repo() as root,
        running_gridd(root) as daemon,
        RawHTTP(daemon.sock, timeout=120) as http,
    ):
        started = time.perf_counter()
        api(http, "POST", "/plans", {"tasks": plan})
        load_s = time.perf_counter() - started
        request = RawHTTP.request_bytes("GET", "/state")
        sock = http.sock
        for _ in range(3):
            status, body = _get(sock, request)
            if status != 200:
                raise RuntimeError(f"GET /state -> {status}")
        times = []
        for _ in range(gets):
            t0 = time.perf_counter()
            _get(sock, request)
            times.append(time.perf_counter() - t0)
        state = json.loads(body)
        rss = psutil.Process(daemon.pid).memory_info().rss
    return {
        "load_s": load_s,
        "state_ms": {"p50": _ms(times, 50), "p90": _ms(times, 90), "max": _ms(times, 100)},
        "state_p50_s": percentile(times, 50),
        "state_bytes": len(body),
        "tasks": state["tasks"],
        "daemon_rss_mb": round(rss / 2**20, 1),
    }


def _baseline(tasks: list[dict[str, Any]]) -> float:
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        json.dumps(tasks, separators=(",", ":"))
        times.append(time.perf_counter() - t0)
    return median(times)


def run(quick: bool) -> dict[str, Any]:
    plan = random_plan(TASKS)
    sched = asyncio.run(
        _scheduler_part(
            plan,
            idle=IDLE_PASSES_QUICK if quick else IDLE_PASSES,
            forced=FORCED_PASSES_QUICK if quick else FORCED_PASSES,
        )
    )
    daemon = _daemon_part(plan, gets=STATE_GETS_QUICK if quick else STATE_GETS)
    tasks = daemon.pop("tasks")
    if len(tasks) != TASKS:
        raise RuntimeError(f"GET /state returned {len(tasks)} tasks, expected {TASKS}")
    base_s = _baseline(tasks)
    counts = AGENT_COUNTS_QUICK if quick else AGENT_COUNTS
    live = [
        measure(n, window=3.0 if quick else 5.0, requests=100 if quick else 300) for n in counts
    ]
    top = live[-1]
    idle_p99_ms = sched.pop("idle_p99_s") * 1000
    state_p50_ms = daemon.pop("state_p50_s") * 1000
    ratio = state_p50_ms / (base_s * 1000)
    return result(
        name=NAME,
        title=f"scale: {TASKS:,} tasks in a random DAG",
        checks=[
            Check(
                metric=f"idle scheduler pass p99 ({sched['idle_passes']} passes, 8 agents live)",
                value=round(idle_p99_ms, 3),
                unit="ms",
                target=f"<= {IDLE_P99_TARGET_MS:g} ms",
                passed=idle_p99_ms <= IDLE_P99_TARGET_MS,
            ),
            Check(
                metric=f"GET /state p50 with {TASKS:,} tasks",
                value=round(state_p50_ms, 2),
                unit="ms",
                target=f"<= {STATE_P50_TARGET_MS:g} ms",
                passed=state_p50_ms <= STATE_P50_TARGET_MS,
            ),
            *_agent_checks(top),
        ],
        baseline={
            "what": f"json.dumps of the {TASKS:,} task objects GET /state returned",
            "value": round(base_s * 1000, 2),
            "unit": "ms",
        },
        ratio=ratio,
        ratio_label="GET /state p50 / json.dumps of the tasks",
        figures={"scheduler": sched, "daemon": daemon, "tasks": TASKS, "live_agents": live},
        quick=quick,
        summary=f"POST /plans {daemon['load_s']:.2f} s; idle pass p99"
        f" {idle_p99_ms:.3f} ms, forced pass p50 {sched['forced_ms']['p50']:.1f} ms;"
        f" GET /state p50 {state_p50_ms:.1f} ms ({daemon['state_bytes'] / 2**20:.1f} MB);"
        f" json.dumps {base_s * 1000:.1f} ms; " + "; ".join(_agent_summary(r) for r in live),
    )


def _agent_checks(r: dict[str, Any]) -> list[Check]:
    n = r["agents"]
    rest_ratio = r["cpu_rest_pct"] / max(r["cpu_empty_pct"], 0.01)
    state_ratio = r["state_ticking_ms"]["p50"] / max(r["health_ms"]["p50"], 0.001)
    recover = r["recover_all_s"]
    return [
        Check(
            metric=f"{n} agents at 1 line/s: daemon CPU",
            value=r["cpu_ticking_pct"],
            unit="% core",
            target=f"<= {TICKING_CPU_TARGET:g} %",
            passed=r["cpu_ticking_pct"] <= TICKING_CPU_TARGET,
        ),
        Check(
            metric=f"{n} quiet agents: daemon CPU ({rest_ratio:.2g}x the daemon with none)",
            value=r["cpu_rest_pct"],
            unit="% core",
            target=f"<= {REST_CPU_TARGET:g} %",
            passed=r["cpu_rest_pct"] <= REST_CPU_TARGET,
        ),
        Check(
            metric=f"{n} agents at 1 line/s: GET /state p50 ({state_ratio:.2g}x /health)",
            value=r["state_ticking_ms"]["p50"],
            unit="ms",
            target=f"<= {AGENT_STATE_P50_TARGET_MS:g} ms",
            passed=r["state_ticking_ms"]["p50"] <= AGENT_STATE_P50_TARGET_MS,
        ),
        Check(
            metric=f"{n} agents: write -> SSE event p50",
            value=r["event_ms"]["p50"],
            unit="ms",
            target=f"<= {EVENT_P50_TARGET_MS:g} ms",
            passed=r["event_ms"]["p50"] <= EVENT_P50_TARGET_MS,
        ),
        Check(
            metric=f"{n} agents: recovery after kill -9 of the daemon",
            value=recover if recover is not None else float("nan"),
            unit="s",
            target=f"<= {RECOVER_TARGET_S:g} s",
            passed=recover is not None and recover <= RECOVER_TARGET_S,
        ),
    ]


def _agent_summary(r: dict[str, Any]) -> str:
    return (
        f"{r['agents']} agents: start {r['start_all_s']} s, CPU rest {r['cpu_rest_pct']} %"
        f" / ticking {r['cpu_ticking_pct']} %, /state p50 {r['state_ticking_ms']['p50']} ms,"
        f" event p50 {r['event_ms']['p50']} ms, PSS daemon {r['daemon_pss_mb']} MB"
        f" shims {r['shims_pss_mb']} MB, recover {r['recover_all_s']} s"
    )
