"""SSE subscribers for ``bench_sse_fanout``, run in their own process.

``python -m bench.sse_clients SOCKET SUBSCRIBERS EXPECT [TIMEOUT]`` opens SUBSCRIBERS
``GET /events`` streams on SOCKET, reads each until it has seen EXPECT ``bench.tick`` events
(or the stream ends, or TIMEOUT passes), then prints one JSON object on stdout: per-stream
counts and ordering, and publish-to-receive latency percentiles over every event received.

The parsing is raw (de-chunking and splitting on the blank line by hand, JSON only for the
data line) because one Python process reads 20 streams: a heavier client would measure
itself. Latency uses ``time.monotonic()``, which is one system-wide clock on Linux and
macOS, so the publisher's timestamp (in each event's data) compares across processes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

TICK = b"bench.tick"


def _dechunk(raw: bytearray, out: bytearray) -> bool:
    """Move complete chunks of a chunked body from ``raw`` to ``out``; True at the last one."""
    pos = 0
    done = False
    while True:
        nl = raw.find(b"\r\n", pos)
        if nl < 0:
            break
        size = int(raw[pos:nl].split(b";", 1)[0], 16)
        if size == 0:
            done = True
            pos = nl + 2
            break
        start = nl + 2
        stop = start + size
        if len(raw) < stop + 2:
            break
        out += raw[start:stop]
        pos = stop + 2
    del raw[:pos]
    return done


async def subscriber(path: str, expect: int, latencies: list[float]) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
    writer.write(b"GET /events HTTP/1.1\r\nhost: gridd\r\naccept: text/event-stream\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    chunked = b"transfer-encoding: chunked" in head.lower()
    raw, payload = bytearray(), bytearray()
    received, last_i, last_id = 0, -1, 0
    in_order, ended = True, False
    first_recv = last_recv = 0.0
    try:
        while received < expect and status == 200:
            data = await reader.read(1 << 18)
            now = time.monotonic()
            if not data:
                ended = True
                break
            if chunked:
                raw += data
                if _dechunk(raw, payload):
                    ended = True
            else:
                payload += data
            pos = 0
            while True:
                end = payload.find(b"\r\n\r\n", pos)
                if end < 0:
                    break
                block = payload[pos:end]
                pos = end + 4
                if TICK not in block:
                    continue
                event_id, body = 0, b""
                for line in bytes(block).split(b"\r\n"):
                    if line.startswith(b"id: "):
                        event_id = int(line[4:])
                    elif line.startswith(b"data: "):
                        body = line[6:]
                tick = json.loads(body)
                if tick["i"] != last_i + 1 or event_id <= last_id:
                    in_order = False
                last_i, last_id = tick["i"], event_id
                latencies.append(now - tick["t"])
                if received == 0:
                    first_recv = now
                received += 1
                last_recv = now
            del payload[:pos]
            if ended:
                break
    finally:
        writer.close()
    return {
        "status": status,
        "received": received,
        "in_order": in_order,
        "ended_early": ended and received < expect,
        "first_recv": first_recv,
        "last_recv": last_recv,
    }


async def main_async(path: str, subscribers: int, expect: int, timeout: float) -> dict[str, Any]:
    latencies: list[float] = []
    cpu0, wall0 = time.process_time(), time.monotonic()
    tasks = [asyncio.create_task(subscriber(path, expect, latencies)) for _ in range(subscribers)]
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    streams = []
    for task in tasks:
        if task in done and task.exception() is None:
            streams.append(task.result())
        else:
            error = "timeout" if task in pending else repr(task.exception())
            streams.append({"status": 0, "received": 0, "in_order": False, "error": error})
    latencies.sort()

    def pct(p: float) -> float | None:
        if not latencies:
            return None
        return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))]

    return {
        "streams": streams,
        "latency_s": {"p50": pct(50), "p99": pct(99), "max": latencies[-1] if latencies else None},
        "events_received": len(latencies),
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.monotonic() - wall0,
    }


def main(argv: list[str]) -> int:
    path, subscribers, expect = argv[0], int(argv[1]), int(argv[2])
    timeout = float(argv[3]) if len(argv) > 3 else 120.0
    report = asyncio.run(main_async(path, subscribers, expect, timeout))
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
