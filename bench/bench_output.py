"""Output volume: an agent writes 100 MB; all of it must reach an SSE client.

The agent is ``cat`` of a 100 MB file (20 MB with ``--quick``) of 64-byte ASCII lines,
made in the same run, so every byte is one character of the ``chunk`` texts. Its stdout
goes to the run's ``output.log`` through the per-agent shim; the daemon indexes it in
chunks of up to 64 KiB and publishes each as ``agent.output``, which a raw ``GET /events``
reader (a thread in this process, filtering on the server side by type) decodes and counts.
The clock runs from ``POST /tasks/{id}/start`` to the arrival of the last chunk.

Checks:

- every byte arrives, in ``seq`` order with no gap (a stream dropped for falling behind
  resumes with ``since=<last id>``, as any client would; how often is reported);
- the agent's own writing is not slowed by the supervisor: from the shim's ``agent.json``
  ``startedAt`` to ``exit.json`` ``endedAt``, at least 50 % of the baseline's MB/s (issue 4).

Baseline (same run): ``cat`` of the same file into a file, median of 3. Ratio: gridd's
delivery MB/s (start to last chunk at the client) / cat's MB/s. Also reported: the daemon's
CPU time, and its RSS before, at its highest while the output streamed, and 1 s after.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import Check, RawHTTP, median, result
from bench.harness import EventTap, agent_daemon, api
from gridd.client import SSEEvent

NAME = "output"
MB = 100
MB_QUICK = 20
LINE = b"0123456789abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;-\n"[:63] + b"\n"
SUPERVISOR_TARGET = 0.5
TIMEOUT_S = 120.0


def _payload(path: Path, megabytes: int) -> int:
    block = LINE * (1 << 14)  # 1 MiB
    with path.open("wb") as fh:
        for _ in range(megabytes):
            fh.write(block)
    return megabytes * len(block)


def _baseline(payload: Path, out: Path) -> float:
    times = []
    for _ in range(3):
        out.unlink(missing_ok=True)
        with out.open("wb") as sink:
            started = time.perf_counter()
            subprocess.run(["cat", str(payload)], stdout=sink, check=True)
            times.append(time.perf_counter() - started)
    out.unlink(missing_ok=True)
    return median(times)


class _Counter:
    """Counts one agent's output as it arrives (runs in the reader thread)."""

    def __init__(self) -> None:
        self.chars = 0
        self.chunks = 0
        self.last_seq = 0
        self.in_order = True
        self.last_chunk_at = 0.0
        self.agent_id: str | None = None
        self.end: SSEEvent | None = None
        self.done = threading.Event()

    def __call__(self, now: float, event: SSEEvent) -> None:
        data = event.data
        if event.type == "agent.output":
            if data["seq"] != self.last_seq + 1:
                self.in_order = False
            self.last_seq = data["seq"]
            self.chars += len(data["chunk"])
            self.chunks += 1
            self.last_chunk_at = now
        elif event.type == "agent.spawned":
            self.agent_id = data["agentId"]
        elif event.type in ("agent.completed", "agent.failed", "task.start_failed"):
            self.end = event
            self.done.set()


def _gridd(payload: Path, size: int) -> dict[str, Any]:
    agents = {"cat": {"command": ["cat", str(payload)]}}
    types = [
        "agent.output",
        "agent.spawned",
        "agent.completed",
        "agent.failed",
        "task.start_failed",
    ]
    counter = _Counter()
    with agent_daemon(agents, default_agent="cat") as daemon:
        daemon_proc = psutil.Process(daemon.pid)
        rss_before = daemon_proc.memory_info().rss
        rss_peak = rss_before
        reconnects = 0
        with RawHTTP(daemon.sock, timeout=10) as http:
            api(http, "POST", "/tasks", {"id": "flood", "title": "write 100 MB"})
            tap = EventTap(daemon.sock, types=types, on_event=counter)
            try:
                cpu0 = sum(daemon_proc.cpu_times()[:2])
                started = time.monotonic()
                api(http, "POST", "/tasks/flood/start")
                deadline = started + TIMEOUT_S
                while not counter.done.wait(0.1):
                    rss_peak = max(rss_peak, daemon_proc.memory_info().rss)
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"only {counter.chars:,} of {size:,} bytes arrived")
                    if tap.ended.is_set():  # dropped for falling behind: resume, as clients do
                        reconnects += 1
                        tap.close()
                        tap = EventTap(
                            daemon.sock, types=types, since=tap.last_id, on_event=counter
                        )
                daemon_cpu = sum(daemon_proc.cpu_times()[:2]) - cpu0
                time.sleep(1.0)
                rss_after = daemon_proc.memory_info().rss
            finally:
                tap.close()
        assert counter.end is not None
        if counter.end.type != "agent.completed":
            raise RuntimeError(f"the agent did not complete: {counter.end.type} {counter.end.data}")
        run_dir = daemon.root / ".grid" / "runs" / str(counter.agent_id)
        began = json.loads((run_dir / "agent.json").read_text())["startedAt"]
        ended = json.loads((run_dir / "exit.json").read_text())["endedAt"]
        log_size = (run_dir / "output.log").stat().st_size
    return {
        "bytes_received": counter.chars,
        "chunks": counter.chunks,
        "in_order": counter.in_order,
        "reconnects": reconnects,
        "seconds": counter.last_chunk_at - started,
        "agent_write_s": ended - began,
        "output_log_bytes": log_size,
        "daemon_cpu_s": round(daemon_cpu, 2),
        "daemon_rss_mb": {
            "before": round(rss_before / 2**20, 1),
            "peak": round(rss_peak / 2**20, 1),
            "after": round(rss_after / 2**20, 1),  # 1 s after the run completed
        },
    }


def run(quick: bool) -> dict[str, Any]:
    megabytes = MB_QUICK if quick else MB
    with tempfile.TemporaryDirectory(prefix="gbout", dir="/tmp") as tmp:
        payload = Path(tmp) / "payload.txt"
        size = _payload(payload, megabytes)
        cat_s = _baseline(payload, Path(tmp) / "copy.txt")
        gridd = _gridd(payload, size)
    mib = size / 2**20
    cat_rate = mib / cat_s
    rate = mib / gridd["seconds"]
    write_rate = mib / gridd["agent_write_s"]
    complete = gridd["bytes_received"] == size and gridd["in_order"]
    return result(
        name=NAME,
        title=f"output: an agent writing {megabytes} MB, all of it to an SSE client",
        checks=[
            Check(
                metric="bytes received by the SSE client, in seq order",
                value=gridd["bytes_received"],
                unit="B",
                target=f"== {size:,}",
                passed=complete,
            ),
            Check(
                metric="agent's write through the shim, vs cat into a file",
                value=round(write_rate, 1),
                unit="MB/s",
                target=f">= {SUPERVISOR_TARGET:.0%} of cat ({SUPERVISOR_TARGET * cat_rate:.0f} MB/s)",
                passed=write_rate >= SUPERVISOR_TARGET * cat_rate,
            ),
        ],
        baseline={
            "what": f"cat of the same {megabytes} MB into a file (median of 3)",
            "value": round(cat_rate, 1),
            "unit": "MB/s",
            "seconds": round(cat_s, 3),
        },
        ratio=rate / cat_rate,
        ratio_label="gridd delivery MB/s (start -> last chunk at the client) / cat MB/s",
        figures={
            "megabytes": megabytes,
            "delivery_mb_per_s": round(rate, 1),
            "agent_write_mb_per_s": round(write_rate, 1),
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in gridd.items()},
        },
        quick=quick,
        summary=f"{megabytes} MB delivered in {gridd['seconds']:.2f} s ({rate:.0f} MB/s,"
        f" {gridd['chunks']} chunks, {gridd['reconnects']} reconnects); agent wrote at"
        f" {write_rate:.0f} MB/s; cat {cat_rate:.0f} MB/s; daemon CPU"
        f" {gridd['daemon_cpu_s']} s, RSS {gridd['daemon_rss_mb']['before']} ->"
        f" {gridd['daemon_rss_mb']['peak']} MB",
        notes="MB = MiB; the payload is ASCII, so characters received = bytes written",
    )
