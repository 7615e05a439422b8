"""Durability: the per-agent shim's memory, and ``gridctl daemon restart`` with agents
running.

A real daemon, started the way users start it (``gridctl daemon start``: detached, its
own session), runs a session of 5 idle agents (``sleep 60``). Once all 5 run:

- **shim RSS**: psutil's RSS (and USS, the memory only that process holds) of each
  agent's shim, the pid its ``.grid/runs/<agent>/agent.json`` names as ``shimPid``.
  Target: <= 15 MB per agent.
- **restart**: ``python -m gridd.cli.gridctl --workspace REPO daemon restart`` while a
  poller thread asks ``GET /health`` every 5 ms on fresh connections. Timed from launching
  the command until a daemon with a *new* pid answers. Target: <= 2 s, and afterwards every
  agent still runs: the same pids with the same create times, and ``GET /agents`` lists
  all 5 as running with those pids. Also reported: the command's own wall time and the
  downtime (last answer from the old daemon to first answer from the new one).

Baseline (same run): cold start of gridd alone, ``gridd --workspace`` in a fresh
repository until ``/health`` answers, median of 3 (2 with ``--quick``). Ratio: restart
time / cold start.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import (
    PYTHON,
    Check,
    RawHTTP,
    health_ok,
    launch_gridd,
    make_repo,
    median,
    remove_repo,
    result,
)
from bench.harness import api, kill_agents, workspace_processes, write_config

NAME = "durability"
AGENTS = 5
RSS_TARGET_MB = 15.0
RESTART_TARGET_S = 2.0
COLD_STARTS = 3
COLD_STARTS_QUICK = 2


def _gridctl(root: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "gridd.cli.gridctl", "--workspace", str(root), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _health_pid(sock: Path) -> int | None:
    """The pid of the daemon answering on ``sock`` (fresh connection), or None."""
    try:
        with RawHTTP(sock, timeout=1.0) as http:
            status, body = http.get("/health")
    except OSError:
        return None
    return int(json.loads(body)["pid"]) if status == 200 else None


class _Poller:
    """Asks ``/health`` every 5 ms; remembers when each pid last and first answered."""

    def __init__(self, sock: Path) -> None:
        self.sock = sock
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="health-poller", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            pid = _health_pid(self.sock)
            now = time.monotonic()
            if pid is not None:
                self.first.setdefault(pid, now)
                self.last[pid] = now
            time.sleep(0.005)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def _cold_start() -> float:
    root = make_repo()
    try:
        started = time.perf_counter()
        daemon = launch_gridd(root)
        try:
            while not health_ok(daemon.sock):
                if daemon.proc.poll() is not None or time.perf_counter() - started > 15:
                    raise RuntimeError("gridd did not start")
                time.sleep(0.005)
            return time.perf_counter() - started
        finally:
            daemon.stop()
    finally:
        remove_repo(root)


def _identity(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _stop_daemon(root: Path) -> None:
    """``gridctl daemon stop``; failing that, SIGKILL to the daemon gridd.pid names, but
    only when that process is a gridd serving this very workspace."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        _gridctl(root, "daemon", "stop", timeout=20)
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        pid = int((root / ".grid" / "gridd.pid").read_text())
        proc = psutil.Process(pid)
        if str(root) in " ".join(proc.cmdline()):
            proc.kill()
            proc.wait(5)


def _measure(root: Path) -> dict[str, Any]:
    sock = root / ".grid" / "gridd.sock"
    started = _gridctl(root, "daemon", "start")
    if started.returncode != 0:
        raise RuntimeError(f"gridctl daemon start: {started.stdout}{started.stderr}")
    old_pid = _health_pid(sock)
    with RawHTTP(sock, timeout=10) as http:
        api(
            http,
            "POST",
            "/plans",
            {"tasks": [{"id": f"d{i}", "title": f"idle {i}"} for i in range(AGENTS)]},
        )
        api(http, "POST", "/session/start", {"maxAgents": AGENTS})
        deadline = time.monotonic() + 20
        while True:
            agents = api(http, "GET", "/agents")
            if len(agents) == AGENTS and all(a["pid"] and a["status"] == "running" for a in agents):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"agents did not all start: {agents}")
            time.sleep(0.05)
    time.sleep(0.5)  # let the shims settle into their wait()
    before: dict[str, dict[str, Any]] = {}
    shims: list[dict[str, float]] = []
    for agent in agents:
        info = json.loads((Path(agent["runDir"]) / "agent.json").read_text())
        shim = psutil.Process(int(info["shimPid"]))
        mem = shim.memory_full_info()
        shims.append({"rss_mb": mem.rss / 2**20, "uss_mb": mem.uss / 2**20})
        pid = int(info["pid"])
        before[agent["id"]] = {"pid": pid, "created": _identity(pid), "shim": shim.pid}

    poller = _Poller(sock)
    try:
        time.sleep(0.1)
        t0 = time.monotonic()
        restart = _gridctl(root, "daemon", "restart")
        command_s = time.monotonic() - t0
        deadline = time.monotonic() + 10
        while not any(p != old_pid for p in poller.first) and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        poller.close()
    if restart.returncode != 0:
        raise RuntimeError(f"gridctl daemon restart: {restart.stdout}{restart.stderr}")
    new_pids = [p for p in poller.first if p != old_pid]
    if not new_pids:
        raise RuntimeError("no new daemon answered within 10 s of the restart")
    new_first = poller.first[new_pids[0]]
    old_last = poller.last.get(old_pid or -1, t0)

    with RawHTTP(sock, timeout=10) as http:
        after = {a["id"]: a for a in api(http, "GET", "/agents")}
    survived = 0
    for agent_id, was in before.items():
        now = after.get(agent_id)
        same = was["created"] is not None and _identity(was["pid"]) == was["created"]
        listed = now is not None and now["pid"] == was["pid"] and now["status"] == "running"
        survived += same and listed
    return {
        "shims": shims,
        "restart_s": new_first - t0,
        "command_s": command_s,
        "downtime_s": new_first - old_last,
        "survived": survived,
        "old_pid": old_pid,
        "new_pid": new_pids[0],
    }


def run(quick: bool) -> dict[str, Any]:
    cold = [_cold_start() for _ in range(COLD_STARTS_QUICK if quick else COLD_STARTS)]
    root = make_repo()
    try:
        write_config(root, agents={"idle": {"command": ["sleep", "60"]}}, default_agent="idle")
        figures = _measure(root)
    finally:
        with (
            contextlib.suppress(Exception),
            RawHTTP(root / ".grid" / "gridd.sock", timeout=5) as http,
        ):
            api(http, "POST", "/session/stop?force=1")
        _stop_daemon(root)
        kill_agents(root)
        leftover = workspace_processes(root)
        remove_repo(root)
    if leftover:
        raise RuntimeError(f"processes left behind: {[p.pid for p in leftover]}")
    cold_s = median(cold)
    rss = [s["rss_mb"] for s in figures["shims"]]
    uss = [s["uss_mb"] for s in figures["shims"]]
    restart_s = figures["restart_s"]
    return result(
        name=NAME,
        title=f"durability: shim memory and daemon restart with {AGENTS} agents",
        checks=[
            Check(
                metric="shim RSS per agent (largest of 5)",
                value=round(max(rss), 2),
                unit="MB",
                target=f"<= {RSS_TARGET_MB:g} MB",
                passed=max(rss) <= RSS_TARGET_MB,
            ),
            Check(
                metric="gridctl daemon restart -> new daemon answering",
                value=round(restart_s, 3),
                unit="s",
                target=f"<= {RESTART_TARGET_S:g} s",
                passed=restart_s <= RESTART_TARGET_S,
            ),
            Check(
                metric="agents still running after the restart (same pids)",
                value=figures["survived"],
                unit="",
                target=f"== {AGENTS}",
                passed=figures["survived"] == AGENTS,
            ),
        ],
        baseline={
            "what": f"cold start of gridd alone, launch -> /health, median of {len(cold)}",
            "value": round(cold_s, 3),
            "unit": "s",
        },
        ratio=restart_s / cold_s,
        ratio_label="restart -> answering / cold start",
        figures={
            "shim_rss_mb": [round(x, 2) for x in rss],
            "shim_uss_mb": [round(x, 2) for x in uss],
            "restart_s": round(restart_s, 3),
            "command_s": round(figures["command_s"], 3),
            "downtime_s": round(figures["downtime_s"], 3),
            "cold_start_s": [round(x, 3) for x in cold],
            "survived": figures["survived"],
        },
        quick=quick,
        summary=f"shim RSS {median(rss):.1f} MB (USS {median(uss):.1f} MB) per agent; restart"
        f" -> answering {restart_s:.2f} s (command {figures['command_s']:.2f} s, downtime"
        f" {figures['downtime_s']:.2f} s); {figures['survived']}/{AGENTS} agents kept;"
        f" cold start {cold_s:.2f} s",
    )
