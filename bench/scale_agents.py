"""Scale with live agents: 16, 64 and 256 tiny tickers (``bench/agents/tick.py``) on one daemon.

For each count, on a fresh repository and a real ``gridd``:

- **start**: ``POST /plans`` with N tasks, ``POST /session/start {maxAgents: N}``, timed until
  all N agents run (``GET /agents``).
- **at rest**: the daemon's CPU (user + system, as a share of one core) over a window while
  every agent is silent; ``GET /state`` and ``GET /health`` p50/p99 on a keep-alive socket.
- **1 line/s each**: the agents print ``tick <monotonic>`` once a second; the daemon's CPU
  over a window, ``GET /state`` p50/p99 meanwhile, and write -> SSE event latency read by
  one ``GET /events?types=agent.output`` stream (the agent's own stamp against the
  reader's clock: one system-wide monotonic clock on Linux).
- **memory**: PSS of the daemon and of all shims together.
- **recovery**: ``kill -9`` of the daemon, a new one started, timed until it answers with all
  N agents live again.

Baseline, same run: the same daemon's CPU at rest before any agent exists (ratio = CPU at
rest with N agents / that), and ``GET /health`` p50 for ``GET /state``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import (
    RawHTTP,
    launch_gridd,
    make_repo,
    percentile,
    remove_repo,
    running_gridd,
    wait_until,
)
from bench.harness import api, kill_agents, workspace_processes, write_config

TICK_AGENT = Path(__file__).resolve().parent / "agents" / "tick.py"
_TICK = re.compile(rb"tick (\d+\.\d+)")


def _ms(values: list[float], p: float) -> float:
    return round(percentile(values, p) * 1000, 3) if values else float("nan")


def cpu_share(pid: int, seconds: float) -> float:
    """The process's CPU (user + system) over ``seconds`` of wall time, as % of one core."""
    proc = psutil.Process(pid)
    before, t0 = proc.cpu_times(), time.monotonic()
    time.sleep(seconds)
    after, t1 = proc.cpu_times(), time.monotonic()
    used = (after.user - before.user) + (after.system - before.system)
    return round(100 * used / (t1 - t0), 2)


def latencies(http: RawHTTP, target: str, count: int) -> list[float]:
    request = RawHTTP.request_bytes("GET", target)
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        status, _ = http.send(request)
        times.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError(f"GET {target} -> {status}")
    return times


class EventLatency:
    """One SSE stream of ``agent.output``: write -> receive latency of every tick line."""

    def __init__(self, sock: Path, since: int) -> None:
        self.samples: list[float] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(str(sock))
        self._sock.sendall(
            f"GET /events?types=agent.output&since={since} HTTP/1.1\r\nhost: g\r\n"
            "accept: text/event-stream\r\n\r\n".encode()
        )
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending = b""
        self._sock.settimeout(0.5)
        while not self._stop:
            try:
                data = self._sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            now = time.monotonic()
            pending += data
            cut = pending.rfind(b"\n")  # whole lines only: a stamp is never cut in two
            if cut < 0:
                continue
            block, pending = pending[:cut], pending[cut + 1 :]
            for match in _TICK.finditer(block):
                lag = now - float(match.group(1))
                if 0 <= lag < 30:
                    self.samples.append(lag)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self._sock.close()


def pss_mb(procs: list[psutil.Process]) -> float:
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_full_info().pss
    return round(total / 2**20, 1)


def _live(http: RawHTTP) -> int:
    return sum(1 for a in api(http, "GET", "/agents") if a.get("pid"))


def measure(n: int, *, window: float, requests: int) -> dict[str, Any]:
    root = make_repo()
    control = Path(f"{root}-control")
    control.mkdir()
    out: dict[str, Any] = {"agents": n}
    try:
        write_config(
            root,
            agents={"tick": {"command": [sys.executable, str(TICK_AGENT), str(control)]}},
            default_agent="tick",
            scheduler={"max_agents": n, "launch_grace_seconds": 600.0},
        )
        with running_gridd(root) as daemon, RawHTTP(daemon.sock, timeout=60) as http:
            time.sleep(1.0)
            out["cpu_empty_pct"] = cpu_share(daemon.pid, window)
            api(
                http,
                "POST",
                "/plans",
                {"tasks": [{"id": f"k{i}", "title": f"tick {i}"} for i in range(n)]},
            )
            t0 = time.monotonic()
            api(http, "POST", "/session/start", {"maxAgents": n})
            if not wait_until(lambda: _live(http) >= n, timeout=300, interval=0.2):
                raise RuntimeError(f"only {_live(http)} of {n} agents started")
            out["start_all_s"] = round(time.monotonic() - t0, 2)
            time.sleep(2.0)  # the agents' "ready" lines are read; then silence
            out["cpu_rest_pct"] = cpu_share(daemon.pid, window)
            health = latencies(http, "/health", requests)
            state = latencies(http, "/state", requests)
            out["health_ms"] = {"p50": _ms(health, 50), "p99": _ms(health, 99)}
            out["state_rest_ms"] = {"p50": _ms(state, 50), "p99": _ms(state, 99)}
            last = int(api(http, "GET", "/state")["daemon"]["lastEventId"])
            stream = EventLatency(daemon.sock, last)
            (control / "ticking").touch()
            time.sleep(2.0)
            out["cpu_ticking_pct"] = cpu_share(daemon.pid, window)
            state = latencies(http, "/state", requests)
            out["state_ticking_ms"] = {"p50": _ms(state, 50), "p99": _ms(state, 99)}
            (control / "ticking").unlink()
            time.sleep(1.5)
            stream.close()
            out["event_ms"] = {
                "p50": _ms(stream.samples, 50),
                "p99": _ms(stream.samples, 99),
                "samples": len(stream.samples),
            }
            shims = [
                p
                for p in workspace_processes(root)
                if any(a.endswith("shim.py") for a in (p.cmdline() or []))
            ]
            out["daemon_pss_mb"] = pss_mb([psutil.Process(daemon.pid)])
            out["shims_pss_mb"] = pss_mb(shims)
            out["shims"] = len(shims)
            # Recovery: kill -9, start again, until it answers with every agent live.
            os.kill(daemon.pid, signal.SIGKILL)
            daemon.proc.wait()
        t0 = time.monotonic()
        again = launch_gridd(root)
        try:

            def recovered() -> bool:
                try:
                    with RawHTTP(again.sock, timeout=5) as h:
                        return _live(h) >= n
                except (OSError, RuntimeError, ValueError):
                    return False

            ok = wait_until(recovered, timeout=120, interval=0.02)
            out["recover_all_s"] = round(time.monotonic() - t0, 3) if ok else None
            with contextlib.suppress(OSError, RuntimeError), RawHTTP(again.sock, timeout=10) as h:
                api(h, "POST", "/session/stop?force=1")
        finally:
            (control / "stop").touch()
            again.stop()
    finally:
        (control / "stop").touch()
        kill_agents(root)
        remove_repo(root)
        with contextlib.suppress(OSError):
            for f in control.iterdir():
                f.unlink()
            control.rmdir()
    return out
