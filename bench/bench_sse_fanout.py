"""SSE fan-out: 10,000 events published as fast as possible to 20 ``GET /events`` streams.

There is no public API to publish arbitrary events, so the server runs inside this process:
gridd's real ``Grid`` (real ``Store`` on a throwaway database, real ``EventBus``) and
``create_app`` under the very uvicorn server the daemon runs (``gridd.daemon.build_server``:
the guarded "auto" HTTP protocol, lifespan off, same timeouts; only its signal handling is
off), on a socket bound by ``gridd.daemon.bind_socket``. The 20 subscribers run in a
separate process (``bench/sse_clients.py``) so that parsing 200,000 events does not steal
the publisher's event loop; on a 2-core machine that gives the server one core and the
clients the other.

Two phases, each with a fresh set of 20 streams on the same server:

- **burst** (the target): ``grid.bus.publish("bench.tick", {"i", "t"})`` in a loop, with ``t``
  a ``time.monotonic()`` stamp, yielding to the event loop (``await asyncio.sleep(0)``) every
  100 events: as fast as a producer inside the daemon could go. Each event is appended to
  SQLite before it is fanned out, as in production. Target: every stream receives all
  10,000 ticks in order and no subscriber is dropped for overflowing its queue
  (``events.subscriber_queue``, default 4096).
- **paced** (informational): the same, but the publisher also waits while any subscriber's
  queue holds 64 events or more (it peeks at the bus's private subscriber set; the bus
  itself has no back-pressure). This measures what the SSE path can sustain when nobody
  is dropped: events/s and publish-to-receive latency under load.

Reported: events/s (10,000 over first publish to last receipt by the slowest stream),
p50/p99 latency. Baseline (same run): the same 10,000 events and batching through plain
bounded ``asyncio.Queue`` fan-out to 20 in-process consumers; ratio = gridd events/s (burst
when it completes, else paced) / baseline events/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from bench.common import PYTHON, ROOT, Check, make_repo, percentile, remove_repo, result

NAME = "sse_fanout"
EVENTS = 10_000
SUBSCRIBERS = 20
BATCH = 100  # events published between two yields to the event loop
CLIENT_TIMEOUT_S = 120.0
#: paced phase: the publisher waits while any subscriber queue holds this many events
PACE_HIGH_WATER = 64

Publish = Callable[[str, dict[str, Any]], Any]


async def _publish(publish: Publish, n: int, *, hold: Callable[[], bool] | None = None) -> float:
    """Publish ``n`` ticks; returns the monotonic start time. ``hold()`` True = wait first."""
    started = time.monotonic()
    for i in range(n):
        if hold is not None:
            while hold():
                await asyncio.sleep(0)
        publish("bench.tick", {"i": i, "t": time.monotonic()})
        if i % BATCH == BATCH - 1:
            await asyncio.sleep(0)
    return started


# -- baseline -----------------------------------------------------------------------------------


async def _baseline(n: int, subscribers: int, queue_size: int) -> dict[str, Any]:
    """The same events through bare bounded ``asyncio.Queue`` fan-out, no I/O at all."""
    queues: list[asyncio.Queue[dict[str, Any] | None]] = [
        asyncio.Queue(queue_size) for _ in range(subscribers)
    ]
    latencies: list[float] = []
    last_recv = [0.0] * subscribers
    overflowed = 0

    async def consume(k: int) -> None:
        q = queues[k]
        while (item := await q.get()) is not None:
            now = time.monotonic()
            latencies.append(now - item["t"])
            last_recv[k] = now

    def publish(type_: str, data: dict[str, Any]) -> None:
        nonlocal overflowed
        for q in queues:
            try:
                q.put_nowait(data)
            except asyncio.QueueFull:
                overflowed += 1

    consumers = [asyncio.create_task(consume(k)) for k in range(subscribers)]
    started = await _publish(publish, n)
    for q in queues:
        await q.put(None)
    await asyncio.gather(*consumers)
    elapsed = max(last_recv) - started
    return {
        "events_per_s": n / elapsed,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "overflowed": overflowed,
    }


# -- gridd --------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _serving() -> AsyncIterator[Any]:
    """gridd's real Grid and app on a real uvicorn over a fresh workspace; yields the Grid."""
    from gridd.compose import compose
    from gridd.daemon import bind_socket, build_server
    from gridd.settings import Settings
    from gridd.store import Store
    from gridd.workspace import Workspace

    root = make_repo()
    ws = Workspace(root=root)
    ws.ensure_grid_dir()
    settings = Settings()
    store = Store.open(ws.db_path)
    grid = compose(workspace=ws, settings=settings, store=store, environ=os.environ)
    server: Any = None
    server_task: asyncio.Task[None] | None = None
    try:
        # Exactly the server the daemon runs (protocol guards, timeouts), minus its signals.
        server = build_server(grid, handle_signals=False)
        sock = bind_socket(ws.socket_path)
        await grid.start()
        server_task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if server_task.done():
                server_task.result()
                raise RuntimeError("uvicorn exited before starting")
            await asyncio.sleep(0.01)
        yield grid
    finally:
        await grid.stop()
        if server is not None and server_task is not None:
            server.should_exit = True
            await asyncio.wait_for(server_task, 15)
        store.close()
        ws.socket_path.unlink(missing_ok=True)
        remove_repo(root)


async def _phase(grid: Any, *, n: int, subscribers: int, paced: bool) -> dict[str, Any]:
    """Connect ``subscribers`` streams in a child process, publish ``n`` ticks, collect."""
    bus = grid.bus
    deadline = time.monotonic() + 10
    while bus.subscriber_count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # the previous phase's streams are still closing
    dropped_before = bus.dropped_total
    clients = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "bench.sse_clients",
        str(grid.workspace.socket_path),
        str(subscribers),
        str(n),
        str(CLIENT_TIMEOUT_S),
        cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    while bus.subscriber_count < subscribers:
        if time.monotonic() > deadline or clients.returncode is not None:
            clients.kill()
            raise RuntimeError(f"only {bus.subscriber_count} subscribers connected")
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # let the opening snapshots go out
    subs = bus._subscribers  # read-only peek: the bus offers no back-pressure

    def full() -> bool:
        return any(s.queue.qsize() >= PACE_HIGH_WATER for s in subs)

    cpu0 = time.process_time()
    started = await _publish(bus.publish, n, hold=full if paced else None)
    published = time.monotonic()
    out, _ = await asyncio.wait_for(clients.communicate(), CLIENT_TIMEOUT_S + 10)
    server_cpu = time.process_time() - cpu0
    server_wall = time.monotonic() - started
    if clients.returncode != 0:
        raise RuntimeError(f"sse_clients exited with {clients.returncode}")
    report: dict[str, Any] = json.loads(out)
    streams = report["streams"]
    received = [s["received"] for s in streams]
    complete = all(r == n for r in received) and all(s["in_order"] for s in streams)
    elapsed = max(s.get("last_recv", 0.0) for s in streams) - started
    lat = report["latency_s"]

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 2)

    return {
        "complete": complete,
        "dropped": bus.dropped_total - dropped_before,
        "received_min": min(received),
        "received_per_stream": received,
        "streams_ended_early": sum(1 for s in streams if s.get("ended_early")),
        "events_per_s": round(n / elapsed, 1) if complete and elapsed > 0 else None,
        "deliveries_per_s": round(n * subscribers / elapsed, 1) if complete else None,
        "publish_s": round(published - started, 3),
        "delivered_all_s": round(elapsed, 3) if complete else None,
        "latency_ms": {"p50": ms(lat["p50"]), "p99": ms(lat["p99"]), "max": ms(lat["max"])},
        # CPU busy fraction: ~1.0 means that side was the bottleneck.
        "server_cpu_busy": round(server_cpu / server_wall, 2),
        "clients_cpu_busy": round(report["cpu_s"] / report["wall_s"], 2),
    }


async def _gridd_run(n: int, subscribers: int) -> dict[str, dict[str, Any]]:
    # The bus logs one warning per dropped subscriber; the figures below count them.
    bus_log = logging.getLogger("gridd.events")
    level = bus_log.level
    bus_log.setLevel(logging.ERROR)
    try:
        async with _serving() as grid:
            burst = await _phase(grid, n=n, subscribers=subscribers, paced=False)
            paced = await _phase(grid, n=n, subscribers=subscribers, paced=True)
    finally:
        bus_log.setLevel(level)
    return {"burst": burst, "paced": paced}


def _summary(burst: dict[str, Any], paced: dict[str, Any], base: dict[str, Any]) -> str:
    def phase(name: str, p: dict[str, Any]) -> str:
        if not p["complete"]:
            return f"{name}: {p['dropped']} of {SUBSCRIBERS} streams dropped"
        lat = p["latency_ms"]
        return (
            f"{name}: {p['events_per_s']:,.0f} events/s, p50 {lat['p50']} ms, p99 {lat['p99']} ms"
        )

    return "; ".join(
        [
            phase("burst", burst),
            phase("paced", paced),
            f"asyncio.Queue {base['events_per_s']:,.0f} events/s, p99 {base['p99_ms']:.2f} ms",
        ]
    )


def run(quick: bool) -> dict[str, Any]:
    base = asyncio.run(_baseline(EVENTS, SUBSCRIBERS, 4096))
    phases = asyncio.run(_gridd_run(EVENTS, SUBSCRIBERS))
    burst, paced = phases["burst"], phases["paced"]
    if burst["events_per_s"]:
        eps, which = burst["events_per_s"], "burst"
    else:
        eps, which = paced["events_per_s"], "paced"
    return result(
        name=NAME,
        title=f"SSE fan-out: {EVENTS:,} events to {SUBSCRIBERS} streams",
        checks=[
            Check(
                metric="burst: ticks received by the slowest stream, in order",
                value=burst["received_min"],
                unit="events",
                target=f"== {EVENTS:,}, in order",
                passed=burst["complete"],
            ),
            Check(
                metric="burst: subscribers dropped",
                value=burst["dropped"],
                unit="",
                target="== 0",
                passed=burst["dropped"] == 0,
            ),
        ],
        baseline={
            "what": f"bounded asyncio.Queue fan-out to {SUBSCRIBERS} in-process consumers",
            "value": round(base["events_per_s"], 1),
            "unit": "events/s",
            "p50_ms": round(base["p50_ms"], 3),
            "p99_ms": round(base["p99_ms"], 3),
        },
        ratio=(eps / base["events_per_s"]) if eps else None,
        ratio_label=f"gridd {which} events/s / asyncio.Queue events/s",
        figures={"burst": burst, "paced": paced, "batch": BATCH, "events": EVENTS},
        quick=quick,
        summary=_summary(burst, paced, base),
        notes="server+publisher in the bench process, 20 subscribers in bench/sse_clients.py;"
        f" the paced phase waits while any queue holds >= {PACE_HIGH_WATER} events",
    )
