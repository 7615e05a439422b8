"""Metrics: ``GET /metrics`` with 200 tasks and 8 running agents, and what metrics cost the
scheduler.

Two parts:

- **over the socket** (a real daemon): 200 tasks, a session with ``maxAgents=8`` whose 8
  agents (``sleep``) run; then ``GET /metrics`` on one keep-alive connection, 200 times (50
  with ``--quick``) after 5 warm-ups. Target: p50 <= 5 ms. Baseline (same run): ``GET
  /health`` on the same connection, the cheapest request there is; ratio = /metrics p50
  over /health p50. Informational: the daemon's CPU time per scrape (psutil; less what it
  spends in an equally long span without scrapes), which a loaded machine does not inflate
  as it inflates wall-clock latency.
- **in-process** (the scheduler): the real ``Grid`` with the same 200 tasks and 8 agents.
  ``run_pass(force=True)`` (the full observe-plan-apply pass) is timed in this thread's CPU
  time (``time.thread_time``: a busy machine's preemption is not counted) after a one-task
  change (so each pass publishes a ``tasks.changed`` through the bus and its listeners),
  in three interleaved modes: *no scrapes*; *scraping*, one full scrape (``render()``)
  before every pass, far more often than any Prometheus would (15 s is usual); and
  *no metrics listener* (the bus listener removed: what the pass costs without metrics at
  all). Rounds alternate the modes to even out a noisy machine; each mode's figure is the
  median. Target: scraping / no scrapes <= 1.10 (within noise: no measurable cost).
  Informational: with listener / without, and one in-loop scrape's p50.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psutil

from bench.common import Check, RawHTTP, median, percentile, result
from bench.harness import agent_daemon, api
from bench.inprocess import busy_grid

NAME = "metrics"
TASKS = 200
MAX_AGENTS = 8
SCRAPES, SCRAPES_QUICK = 200, 50
ROUNDS, ROUNDS_QUICK = 8, 4
PASSES_PER_ROUND = 25
P50_TARGET_MS = 5.0
PASS_RATIO_TARGET = 1.10

PLAN = [{"id": f"m{i}", "title": f"metrics task {i}", "priority": i % 5} for i in range(TASKS)]


def _ms(values: list[float], p: float) -> float:
    return round(percentile(values, p) * 1000, 3)


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _cpu_during(proc: psutil.Process, work: Any) -> tuple[float, float]:
    """(the process's CPU seconds, wall seconds) while ``work()`` runs."""
    before, t0 = proc.cpu_times(), time.perf_counter()
    work()
    after, t1 = proc.cpu_times(), time.perf_counter()
    return (after.user + after.system) - (before.user + before.system), t1 - t0


def _socket_part(scrapes: int) -> dict[str, Any]:
    agents = {"idle": {"command": ["sleep", "300"]}}
    with agent_daemon(agents, default_agent="idle") as daemon, RawHTTP(daemon.sock) as http:
        api(http, "POST", "/plans", {"tasks": PLAN})
        api(http, "POST", "/session/start", {"maxAgents": MAX_AGENTS})
        _wait(
            lambda: sum(1 for a in api(http, "GET", "/agents") if a.get("pid")) >= MAX_AGENTS,
            30,
            "8 agents",
        )
        metrics = RawHTTP.request_bytes("GET", "/metrics")
        health = RawHTTP.request_bytes("GET", "/health")
        body = b""
        for _ in range(5):
            status, body = http.send(metrics)
            if status != 200:
                raise RuntimeError(f"GET /metrics -> {status}")
        times: list[float] = []
        base: list[float] = []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            http.send(metrics)
            t1 = time.perf_counter()
            http.send(health)
            times.append(t1 - t0)
            base.append(time.perf_counter() - t1)
        proc = psutil.Process(daemon.pid)
        busy_cpu, busy_s = _cpu_during(proc, lambda: [http.send(metrics) for _ in range(scrapes)])
        # The same span without scrapes: the 8 agents' monitors and the scheduler's ticks.
        idle_cpu, _ = _cpu_during(proc, lambda: time.sleep(busy_s))
        text = body.decode()
    cpu = max(0.0, busy_cpu - idle_cpu)
    if f"gridd_agents_running {float(MAX_AGENTS)}" not in text:
        raise RuntimeError("the scrape did not show 8 running agents")
    return {
        "scrape_ms": {"p50": _ms(times, 50), "p90": _ms(times, 90), "max": _ms(times, 100)},
        "scrape_p50_s": percentile(times, 50),
        "health_p50_s": percentile(base, 50),
        "daemon_cpu_ms_per_scrape": round(cpu / scrapes * 1000, 3),
        "scrape_bytes": len(body),
        "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
    }


async def _scheduler_part(rounds: int) -> dict[str, Any]:
    async with busy_grid(PLAN, max_agents=MAX_AGENTS) as (grid, _timings):
        listener = grid.metrics.events
        ready = [t.id for t in grid.state.tasks.values() if t.status.value == "ready"]
        times: dict[str, list[float]] = {"no scrapes": [], "scraping": [], "no listener": []}
        renders: list[float] = []
        bump = 0
        for _ in range(rounds):
            for mode, samples in times.items():
                if mode == "no listener":
                    grid.bus._listeners.remove(listener)
                try:
                    for _ in range(PASSES_PER_ROUND):
                        if mode == "scraping":
                            t0 = time.thread_time()
                            grid.metrics.render()
                            renders.append(time.thread_time() - t0)
                        bump += 1
                        task_id = ready[bump % len(ready)]
                        grid.state.update_task(task_id, priority=bump % 5)
                        t0 = time.thread_time()
                        grid.scheduler.run_pass(force=True)
                        samples.append(time.thread_time() - t0)
                        await asyncio.sleep(0.001)
                finally:
                    if mode == "no listener":
                        grid.bus.add_listener(listener)
        return {
            "pass_ms": {mode: _ms(v, 50) for mode, v in times.items()},
            "pass_p50_s": {mode: median(v) for mode, v in times.items()},
            "passes_per_mode": len(times["scraping"]),
            "in_loop_scrape_ms": {"p50": _ms(renders, 50), "max": _ms(renders, 100)},
        }


def run(quick: bool) -> dict[str, Any]:
    sock = _socket_part(SCRAPES_QUICK if quick else SCRAPES)
    sched = asyncio.run(_scheduler_part(ROUNDS_QUICK if quick else ROUNDS))
    p50_ms = sock.pop("scrape_p50_s") * 1000
    health_ms = sock.pop("health_p50_s") * 1000
    passes = sched.pop("pass_p50_s")
    scrape_ratio = passes["scraping"] / passes["no scrapes"]
    listener_ratio = passes["no scrapes"] / passes["no listener"]
    return result(
        name=NAME,
        title=f"metrics: GET /metrics with {TASKS} tasks and {MAX_AGENTS} agents",
        checks=[
            Check(
                metric=f"GET /metrics p50 ({TASKS} tasks, {MAX_AGENTS} agents running)",
                value=round(p50_ms, 3),
                unit="ms",
                target=f"<= {P50_TARGET_MS:g} ms",
                passed=p50_ms <= P50_TARGET_MS,
            ),
            Check(
                metric="scheduler pass p50, scraping / no scrapes",
                value=round(scrape_ratio, 3),
                unit="x",
                target=f"<= {PASS_RATIO_TARGET:g}",
                passed=scrape_ratio <= PASS_RATIO_TARGET,
            ),
        ],
        baseline={"GET /health p50 ms": round(health_ms, 3)},
        ratio=p50_ms / health_ms,
        ratio_label="/metrics p50 / /health p50",
        figures={
            **sock,
            **sched,
            "pass_ratio_scraping": round(scrape_ratio, 3),
            "pass_ratio_listener": round(listener_ratio, 3),
        },
        quick=quick,
        summary=f"/metrics p50 {p50_ms:.2f} ms ({sock['series']} series,"
        f" {sock['scrape_bytes']:,} B); pass p50 {sched['pass_ms']['no scrapes']} ms,"
        f" x{scrape_ratio:.3f} scraping, x{listener_ratio:.3f} with the listener vs without",
    )
