"""Idle cost: resident memory and CPU of a daemon nobody is asking anything.

Four servers run side by side over the same window (idle processes do not compete):
- gridd with no client (the figure the targets apply to);
- gridd with one ``GET /events`` stream attached and read (an editor left open), reported
  for information;
- the bare Starlette app of ``bench/bare_app.py`` (the baseline);
- the stack floor of ``bench/stack_app.py``: the libraries gridd runs on, loaded as gridd
  loads them (uvicorn, pydantic with a model, SQLite in WAL mode),
  and none of gridd's code. gridd's RSS above it is what gridd itself holds.

After startup settles (2 s), RSS is read with psutil, then CPU is the ``cpu_times`` (user +
system) delta over a 30 s window (5 s with ``--quick``) divided by the wall time.
Targets: RSS <= 48 MB (issue 23: 40 MB in issue 14, before the import hacks that met it
went; 60 MB before that), CPU <= 0.5 %. Ratio: gridd RSS /
bare app RSS; also reported, gridd's RSS above the stack floor.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import Check, result, running_app, running_bare_app, running_gridd, temp_repo

NAME = "idle"
RSS_TARGET_MB = 48.0
CPU_TARGET_PCT = 0.5
SETTLE_S = 2.0
MB = 1024 * 1024


class _StreamReader:
    """Holds one SSE stream open and drains it in a thread, like an idle editor would."""

    def __init__(self, sock_path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(sock_path))
        self.sock.sendall(
            b"GET /events HTTP/1.1\r\nhost: gridd\r\naccept: text/event-stream\r\n\r\n"
        )
        self.received = 0
        self._thread = threading.Thread(target=self._drain, name="sse-drain", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            while chunk := self.sock.recv(65536):
                self.received += len(chunk)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(2)


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def run(quick: bool) -> dict[str, Any]:
    window = 5.0 if quick else 30.0
    with (
        temp_repo() as repo_a,
        temp_repo() as repo_b,
        running_gridd(repo_a) as idle,
        running_gridd(repo_b) as watched,
        running_bare_app(repo_a.parent / f"{repo_a.name}-bare.sock") as bare,
        running_app("bench.stack_app", repo_a.parent / f"{repo_a.name}-stack.sock") as stack,
    ):
        reader = _StreamReader(watched.sock)
        try:
            time.sleep(SETTLE_S)
            procs = {
                "gridd": psutil.Process(idle.pid),
                "gridd_with_stream": psutil.Process(watched.pid),
                "bare": psutil.Process(bare.pid),
                "stack": psutil.Process(stack.pid),
            }
            rss0 = {k: p.memory_info().rss for k, p in procs.items()}
            uss = {k: p.memory_full_info().uss for k, p in procs.items()}
            cpu0 = {k: _cpu_seconds(p) for k, p in procs.items()}
            wall0 = time.monotonic()
            time.sleep(window)
            wall = time.monotonic() - wall0
            cpu = {k: (_cpu_seconds(p) - cpu0[k]) / wall * 100 for k, p in procs.items()}
            rss = {k: max(rss0[k], p.memory_info().rss) for k, p in procs.items()}
        finally:
            reader.close()
    rss_mb = {k: v / MB for k, v in rss.items()}
    return result(
        name=NAME,
        title="Idle daemon: RSS and CPU",
        checks=[
            Check(
                metric="idle RSS",
                value=round(rss_mb["gridd"], 1),
                unit="MB",
                target=f"<= {RSS_TARGET_MB:g} MB",
                passed=rss_mb["gridd"] <= RSS_TARGET_MB,
            ),
            Check(
                metric=f"idle CPU over {window:g} s",
                value=round(cpu["gridd"], 3),
                unit="%",
                target=f"<= {CPU_TARGET_PCT} %",
                passed=cpu["gridd"] <= CPU_TARGET_PCT,
            ),
        ],
        baseline={
            "what": "bare Starlette app on uvicorn (bench/bare_app.py), idle RSS",
            "value": round(rss_mb["bare"], 1),
            "unit": "MB",
            "cpu_pct": round(cpu["bare"], 3),
            "stack_floor_rss_mb": round(rss_mb["stack"], 1),
        },
        ratio=rss["gridd"] / rss["bare"],
        ratio_label="gridd RSS / bare app RSS",
        figures={
            "window_s": round(wall, 2),
            "rss_mb": {k: round(v, 1) for k, v in rss_mb.items()},
            "uss_mb": {k: round(v / MB, 1) for k, v in uss.items()},
            "cpu_pct": {k: round(v, 3) for k, v in cpu.items()},
            "gridd_over_stack_floor_mb": round(rss_mb["gridd"] - rss_mb["stack"], 1),
            "stream_bytes_received": reader.received,
        },
        quick=quick,
        summary=f"RSS gridd {rss_mb['gridd']:.1f} MB, with a stream"
        f" {rss_mb['gridd_with_stream']:.1f} MB, bare {rss_mb['bare']:.1f} MB, stack floor"
        f" {rss_mb['stack']:.1f} MB (gridd {rss_mb['gridd'] - rss_mb['stack']:+.1f} MB); CPU gridd"
        f" {cpu['gridd']:.2f} %, with a stream {cpu['gridd_with_stream']:.2f} %,"
        f" bare {cpu['bare']:.2f} %",
        notes="gridd_with_stream has one GET /events client attached (informational); stack:"
        " bench/stack_app.py, gridd's libraries without gridd",
    )
