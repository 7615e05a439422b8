"""Flood memory: the daemon's RSS while a 20 MiB agent output flood reaches an SSE client.

The agent is ``cat`` of a 20 MiB file of 64-byte ASCII lines (made in the same run; the
size is the issue's, so ``--quick`` changes nothing). A real daemon runs it while one raw
``GET /events?types=agent.output`` reader (a thread in this process) takes every chunk,
resuming with ``since`` if its stream ends; it checks that every byte arrives in ``seq``
order. Two runs, each on a fresh daemon:

- **fast**: the reader takes what it is sent as fast as it can;
- **slow**: the reader is held to 2 MiB/s (the flood takes ~10 s to deliver: slow, not
  stalled, so it must be served, not dropped).

The daemon's RSS (psutil) is sampled every 20 ms: before (idle: after one small agent run,
so that what any first run loads is not counted as the flood's, and 1 s of settling), its
peak, and after (2 s after the last chunk arrived and the task is in review).

Baseline (same run): that daemon's own idle RSS before the flood. Targets (issue 14): peak
<= 80 MB, and back to idle after (within 5 MB of the idle figure). Ratio: the worse peak
over its idle RSS.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import Check, RawHTTP, result
from bench.harness import agent_daemon, api, dechunk, parse_sse_block

NAME = "flood"
MIB = 20
LINE = b"0123456789abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;-\n"[:63] + b"\n"
SLOW_BYTES_PER_S = 2 * 1024 * 1024
PEAK_TARGET_MB = 80.0
AFTER_MARGIN_MB = 5.0
TIMEOUT_S = 120.0
SETTLE_S = 2.0


class _Reader:
    """One ``agent.output`` stream, read by a thread at most ``rate`` bytes/s (0: no cap),
    reconnecting with ``since`` when the daemon ends it."""

    def __init__(self, sock: Path, rate: int) -> None:
        self.sock_path, self.rate = sock, rate
        self.chars = 0
        self.last_seq = 0
        self.in_order = True
        self.last_id = 0
        self.reconnects = -1
        self.last_at = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="flood-reader", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.reconnects += 1
            with contextlib.suppress(OSError):
                self._stream()
            if not self.stop.is_set():
                time.sleep(0.05)

    def _stream(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(1.0)
        try:
            sock.connect(str(self.sock_path))
            target = f"/events?types=agent.output&since={self.last_id}"
            sock.sendall(f"GET {target} HTTP/1.1\r\nhost: gridd\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                data = sock.recv(65536)
                if not data:
                    return
                head += data
            head, _, data = head.partition(b"\r\n\r\n")
            raw, payload = bytearray(), bytearray()
            began, taken = time.monotonic(), 0
            while not self.stop.is_set():
                raw += data
                done = dechunk(raw, payload)
                pos = 0
                while (end := payload.find(b"\r\n\r\n", pos)) >= 0:
                    event = parse_sse_block(bytes(payload[pos:end]))
                    pos = end + 4
                    if (
                        event is not None
                        and event.type == "agent.output"
                        and str(event.data["agentId"]).startswith("cat-")  # not the warm-up
                    ):
                        if event.data["seq"] != self.last_seq + 1:
                            self.in_order = False
                        self.last_seq = event.data["seq"]
                        self.chars += len(event.data["chunk"])
                        self.last_id = event.id or self.last_id
                        self.last_at = time.monotonic()
                del payload[:pos]
                if done:
                    return
                if self.rate:
                    taken += len(data)
                    ahead = taken / self.rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
                try:
                    data = sock.recv(65536 if self.rate else 1 << 20)
                except TimeoutError:
                    data = b""
                    continue
                if not data:
                    return
        finally:
            sock.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def _flood(payload: Path, size: int, rate: int) -> dict[str, Any]:
    agents = {"cat": {"command": ["cat", str(payload)]}, "warm": {"command": ["echo", "warm"]}}
    with agent_daemon(agents, default_agent="cat") as daemon:
        proc = psutil.Process(daemon.pid)
        reader = _Reader(daemon.sock, rate)
        try:
            with RawHTTP(daemon.sock, timeout=10) as http:
                # One small run first: what any first agent loads is not the flood's.
                api(http, "POST", "/tasks", {"id": "warm", "title": "warm", "agent": "warm"})
                api(http, "POST", "/tasks/warm/start")
                while api(http, "GET", "/tasks/warm")["status"] != "review":
                    time.sleep(0.05)
                time.sleep(1.0)
                idle = proc.memory_info().rss
                peak = idle
                api(http, "POST", "/tasks", {"id": "flood", "title": "20 MiB of output"})
                started = time.monotonic()
                api(http, "POST", "/tasks/flood/start")
                deadline = started + TIMEOUT_S
                status = "working"
                while reader.chars < size or status != "review":
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{reader.chars:,} of {size:,} bytes arrived")
                    peak = max(peak, proc.memory_info().rss)
                    time.sleep(0.02)
                    if reader.chars >= size:
                        status = api(http, "GET", "/tasks/flood")["status"]
                delivered = reader.last_at - started
                settle_until = time.monotonic() + SETTLE_S
                while time.monotonic() < settle_until:
                    peak = max(peak, proc.memory_info().rss)
                    time.sleep(0.02)
                after = proc.memory_info().rss
        finally:
            reader.close()
    mb = 1024 * 1024
    return {
        "delivered_bytes": reader.chars,
        "in_order": reader.in_order,
        "reconnects": reader.reconnects,
        "delivery_s": round(delivered, 2),
        "rss_mb": {
            "idle": round(idle / mb, 1),
            "peak": round(peak / mb, 1),
            "after": round(after / mb, 1),
        },
    }


def run(quick: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gridd-flood-") as tmp:
        payload = Path(tmp) / "flood.txt"
        payload.write_bytes(LINE * (MIB * 1024 * 1024 // len(LINE)))
        size = payload.stat().st_size
        fast = _flood(payload, size, 0)
        slow = _flood(payload, size, SLOW_BYTES_PER_S)
    runs = {"fast": fast, "slow": slow}
    checks = []
    for label, fig in runs.items():
        rss = fig["rss_mb"]
        checks += [
            Check(
                metric=f"{label} reader: every byte, in order",
                value=fig["delivered_bytes"],
                unit="B",
                target=f"{size:,} B",
                passed=fig["delivered_bytes"] == size and fig["in_order"],
            ),
            Check(
                metric=f"{label} reader: peak RSS",
                value=rss["peak"],
                unit="MB",
                target=f"<= {PEAK_TARGET_MB:g} MB",
                passed=rss["peak"] <= PEAK_TARGET_MB,
            ),
            Check(
                metric=f"{label} reader: RSS {SETTLE_S:g} s after",
                value=rss["after"],
                unit="MB",
                target=f"<= idle + {AFTER_MARGIN_MB:g} MB ({rss['idle'] + AFTER_MARGIN_MB:g})",
                passed=rss["after"] <= rss["idle"] + AFTER_MARGIN_MB,
            ),
        ]
    worst = max(runs.values(), key=lambda f: f["rss_mb"]["peak"] / f["rss_mb"]["idle"])
    return result(
        name=NAME,
        title=f"{MIB} MiB agent output flood to one SSE reader: daemon RSS",
        checks=checks,
        baseline={
            "what": "the same daemon's idle RSS before the flood",
            "value": worst["rss_mb"]["idle"],
            "unit": "MB",
        },
        ratio=worst["rss_mb"]["peak"] / worst["rss_mb"]["idle"],
        ratio_label="peak RSS / idle RSS (the worse run)",
        figures=runs,
        quick=quick,
        summary="; ".join(
            f"{k}: RSS {f['rss_mb']['idle']} -> peak {f['rss_mb']['peak']} -> "
            f"{f['rss_mb']['after']} MB, delivered in {f['delivery_s']} s"
            f" ({f['reconnects']} reconnects)"
            for k, f in runs.items()
        ),
        notes="one run each; RSS sampled every 20 ms",
    )
