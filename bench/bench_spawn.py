"""Spawn latency: a task made ready -> ``agent.spawned`` received by an SSE client.

A real daemon serves a fresh repository whose ``.grid/config.toml`` names a trivial agent
(``/bin/sh -c`` writing one file, so the run ends with a commit like real work). For each
of N tasks (15; 6 with ``--quick``), one at a time: ``POST /tasks/{id}/start`` is sent on a
keep-alive connection, and the clock stops when a raw ``GET /events`` reader (a thread in
this process, timestamping each event as it arrives) sees that task's ``agent.spawned``.
The run is then left to finish (``agent.completed``) before the next task starts, so each
spawn is measured alone.

Between the request and the event gridd wakes its scheduler, plans, creates the task's
worktree and branch (``git rev-parse`` x2, ``git worktree add -b``, ``git config``), writes
the run directory, launches the per-agent shim (``python -I -S shim.py``, which
double-forks), waits for the shim's ``agent.json``, then publishes.

Baseline (same run, another fresh repository): ``git worktree add -b`` plus
``subprocess.Popen`` of the same agent command in that worktree, until ``Popen`` returns
(the child has exec'd), N times. Target: gridd's median <= 3 x the baseline's median.

This module also holds the small pieces every agent benchmark uses (``bench_throughput``,
``bench_output``, ``bench_durability``, ``bench_questions``): a workspace with agent
profiles, a daemon that leaves no agent behind, a raw SSE reader, and JSON requests over
the socket. (They could move to ``bench/common.py``.)
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from bench.common import (
    Check,
    Gridd,
    RawHTTP,
    latency_baseline,
    make_repo,
    median,
    ms_summary,
    remove_repo,
    result,
    running_gridd,
)
from gridd.client import SSEEvent

NAME = "spawn"
RUNS = 15
RUNS_QUICK = 6
TARGET_RATIO = 3.0

#: A trivial agent: one file in its worktree, no output. The same argv runs in the baseline.
TRIVIAL_AGENT = ["/bin/sh", "-c", 'echo "work for $GRID_TASK_ID" > "$GRID_TASK_ID.txt"']
#: What gridd adds to git calls (``gridd.git.worktrees``): identity only when none is configured.
GIT_IDENTITY = ["-c", "user.name=gridd", "-c", "user.email=gridd@localhost"]


# -- shared by the agent benchmarks --------------------------------------------------------------


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table, e.g. a profile's sandbox
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def write_config(
    root: Path,
    *,
    agents: dict[str, dict[str, Any]],
    default_agent: str,
    scheduler: dict[str, Any] | None = None,
    sections: dict[str, dict[str, Any]] | None = None,
) -> None:
    """``.grid/config.toml`` with these agent profiles (and other ``sections``, e.g.
    ``{"executors.kubernetes": {...}}``), before the daemon starts."""
    lines = ["[scheduler]", f"default_agent = {_toml(default_agent)}"]
    lines += [f"{k} = {_toml(v)}" for k, v in (scheduler or {}).items()]
    for section, values in (sections or {}).items():
        lines.append(f"\n[{section}]")
        lines += [f"{k} = {_toml(v)}" for k, v in values.items()]
    for name, profile in agents.items():
        lines.append(f"\n[agents.{name}]")
        lines += [f"{k} = {_toml(v)}" for k, v in profile.items()]
    grid = root / ".grid"
    grid.mkdir(mode=0o700, exist_ok=True)
    (grid / "config.toml").write_text("\n".join(lines) + "\n")


def workspace_processes(root: Path) -> list[psutil.Process]:
    """Processes this benchmark's daemon started for ``root``: agents (their environment
    names the workspace) and shims (``shim.py`` processes holding a file under ``.grid/``
    open: their log, whether they serve a run or wait as the spare)."""
    workspace, grid = str(root), str(root / ".grid") + os.sep
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid == os.getpid():
            continue
        try:
            cmdline = proc.info["cmdline"] or []
            if any(arg.endswith("shim.py") for arg in cmdline):
                if any(f.path.startswith(grid) for f in proc.open_files()):
                    found.append(proc)
            elif proc.environ().get("GRID_WORKSPACE") == workspace:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def kill_agents(root: Path) -> int:
    """SIGKILL every agent and shim of ``root`` (the safety net: shims outlive daemons)."""
    procs = workspace_processes(root)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=5)
    return len(procs)


def request(http: RawHTTP, method: str, target: str, body: Any = None) -> tuple[int, Any]:
    """One JSON request on a keep-alive ``RawHTTP`` connection: (status, decoded body)."""
    payload = b"" if body is None else json.dumps(body).encode()
    head = (
        f"{method} {target} HTTP/1.1\r\nhost: gridd\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
    )
    status, raw = http.send(head.encode() + payload)
    return status, (json.loads(raw) if raw else None)


def api(http: RawHTTP, method: str, target: str, body: Any = None) -> Any:
    """``request``, raising on a 4xx/5xx with the daemon's error body."""
    status, data = request(http, method, target, body)
    if status >= 400:
        raise RuntimeError(f"{method} {target} -> {status}: {data}")
    return data


@contextlib.contextmanager
def agent_daemon(
    agents: dict[str, dict[str, Any]],
    *,
    default_agent: str,
    scheduler: dict[str, Any] | None = None,
    sections: dict[str, dict[str, Any]] | None = None,
) -> Iterator[Gridd]:
    """A fresh repository with these profiles and a real gridd serving it. On the way out,
    however the block ends: the session force-stopped, the daemon stopped, any agent or
    shim still alive killed, the repository removed."""
    root = make_repo()
    try:
        write_config(
            root,
            agents=agents,
            default_agent=default_agent,
            scheduler=scheduler,
            sections=sections,
        )
        with running_gridd(root) as daemon:
            try:
                yield daemon
            finally:
                stop_session(daemon.sock)
    finally:
        kill_agents(root)
        remove_repo(root)


def stop_session(sock: Path, *, timeout: float = 10.0) -> None:
    """Force-stop the session and wait (briefly) until no agent is live."""
    try:
        with RawHTTP(sock, timeout=timeout) as http:
            request(http, "POST", "/session/stop?force=1")
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                status, agents = request(http, "GET", "/agents")
                if status != 200 or not agents:
                    return
                time.sleep(0.05)
    except (OSError, ValueError):
        pass  # the daemon is gone: kill_agents is the net


def _dechunk(raw: bytearray, out: bytearray) -> bool:
    """Move complete chunks of a chunked body from ``raw`` to ``out``; True at the last."""
    pos = 0
    while True:
        nl = raw.find(b"\r\n", pos)
        if nl < 0:
            break
        size = int(raw[pos:nl].split(b";", 1)[0], 16)
        if size == 0:
            del raw[: nl + 2]
            return True
        start = nl + 2
        if len(raw) < start + size + 2:
            break
        out += raw[start : start + size]
        pos = start + size + 2
    del raw[:pos]
    return False


def _parse_block(block: bytes) -> SSEEvent | None:
    event_id: int | None = None
    kind, data = "message", b""
    for line in block.split(b"\r\n"):
        if line.startswith(b"data: "):
            data = line[6:]
        elif line.startswith(b"event: "):
            kind = line[7:].decode()
        elif line.startswith(b"id: "):
            with contextlib.suppress(ValueError):
                event_id = int(line[4:])
    if not data:
        return None  # a keep-alive comment
    return SSEEvent(id=event_id, type=kind, data=json.loads(data))


class EventTap:
    """``GET /events?types=...`` on a raw socket, read by a thread; every event is handed
    to ``on_event(arrival, event)`` with its ``time.monotonic()`` arrival stamp (the default
    queues it for ``expect``). Cheap, so the daemon rather than the client is measured."""

    def __init__(
        self,
        sock_path: Path,
        *,
        types: list[str],
        since: int | None = None,
        on_event: Callable[[float, SSEEvent], None] | None = None,
    ) -> None:
        self.events: queue.Queue[tuple[float, SSEEvent]] = queue.Queue()
        self.on_event = on_event or (lambda now, ev: self.events.put((now, ev)))
        self.ended = threading.Event()
        self.last_id = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(sock_path))
        target = f"/events?types={','.join(types)}"
        if since is not None:
            target += f"&since={since}"
        self.sock.sendall(
            f"GET {target} HTTP/1.1\r\nhost: gridd\r\naccept: text/event-stream\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("daemon closed the event stream at once")
            head += data
        head, _, rest = head.partition(b"\r\n\r\n")
        if int(head[9:12]) != 200:
            raise RuntimeError(f"GET /events: {head[:200]!r}")
        self.chunked = b"transfer-encoding: chunked" in head.lower()
        self.sock.settimeout(None)
        self._initial = rest
        self.thread = threading.Thread(target=self._read, name="event-tap", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        raw, payload = bytearray(), bytearray()
        data = self._initial
        try:
            while True:
                now = time.monotonic()
                done = False
                if self.chunked:
                    raw += data
                    done = _dechunk(raw, payload)
                else:
                    payload += data
                pos = 0
                while (end := payload.find(b"\r\n\r\n", pos)) >= 0:
                    event = _parse_block(bytes(payload[pos:end]))
                    pos = end + 4
                    if event is not None:
                        if event.id is not None:
                            self.last_id = event.id
                        self.on_event(now, event)
                del payload[:pos]
                if done:
                    return
                data = self.sock.recv(1 << 20)
                if not data:
                    return
        except OSError:
            return
        finally:
            self.ended.set()

    def expect(
        self, predicate: Callable[[SSEEvent], bool], *, timeout: float
    ) -> tuple[float, SSEEvent]:
        """The next queued event matching ``predicate`` (others are dropped), with its
        arrival time; TimeoutError when none comes."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no matching event in time")
            try:
                arrived, event = self.events.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.ended.is_set() and self.events.empty():
                    raise ConnectionError("the event stream ended") from None
                continue
            if predicate(event):
                return arrived, event

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)

    def __enter__(self) -> EventTap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def git_env() -> dict[str, str]:
    """The environment gridd gives git (``gridd.git.worktrees.git``)."""
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


# -- baseline -------------------------------------------------------------------------------------


def _baseline(runs: int) -> list[float]:
    """``git worktree add -b`` + ``Popen`` of the agent in it, until ``Popen`` returns."""
    root = make_repo()
    env = git_env()
    try:
        (root / ".git" / "info" / "exclude").write_text(".grid/\n")
        wt_dir = root / ".grid" / "worktrees"
        wt_dir.mkdir(parents=True)
        times = []
        for i in range(runs):
            path = wt_dir / f"b{i}"
            agent_env = {**env, "GRID_TASK_ID": f"b{i}"}
            started = time.perf_counter()
            subprocess.run(
                ["git", "worktree", "add", "-q", "-b", f"grid/b{i}", "--", str(path), "HEAD"],
                cwd=root,
                env=env,
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            proc = subprocess.Popen(
                TRIVIAL_AGENT,
                cwd=path,
                env=agent_env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            times.append(time.perf_counter() - started)
            proc.wait()
        return times
    finally:
        remove_repo(root)


# -- gridd --------------------------------------------------------------------------------------------


def _of_task(task_id: str) -> Callable[[SSEEvent], bool]:
    return lambda event: bool(event.data.get("taskId") == task_id)


def _gridd(runs: int) -> dict[str, Any]:
    agents = {"trivial": {"command": TRIVIAL_AGENT}}
    latencies: list[float] = []
    types = ["agent.spawned", "agent.completed", "agent.failed", "task.start_failed"]
    with (
        agent_daemon(agents, default_agent="trivial") as daemon,
        RawHTTP(daemon.sock, timeout=10) as http,
        EventTap(daemon.sock, types=types) as tap,
    ):
        ids = [f"spawn-{i}" for i in range(runs + 1)]  # the first is a warm-up
        api(http, "POST", "/tasks", [{"id": i, "title": i} for i in ids])
        for n, task_id in enumerate(ids):
            started = time.monotonic()
            api(http, "POST", f"/tasks/{task_id}/start")
            arrived, event = tap.expect(_of_task(task_id), timeout=30)
            if event.type != "agent.spawned":
                raise RuntimeError(f"{task_id}: {event.type} {event.data}")
            if n:
                latencies.append(arrived - started)
            _, done = tap.expect(_of_task(task_id), timeout=30)
            if done.type != "agent.completed":
                raise RuntimeError(f"{task_id}: {done.type} {done.data}")
    return {"latencies": latencies}


def run(quick: bool) -> dict[str, Any]:
    runs = RUNS_QUICK if quick else RUNS
    base = _baseline(runs)
    gridd = _gridd(runs)["latencies"]
    base_ms = median(base) * 1000
    gridd_ms = median(gridd) * 1000
    ratio = gridd_ms / base_ms
    return result(
        name=NAME,
        title="spawn latency: task started -> agent.spawned at an SSE client",
        checks=[
            Check(
                metric=f"median spawn latency ({runs} spawns)",
                value=round(gridd_ms, 2),
                unit="ms",
                target=f"<= {TARGET_RATIO:g} x baseline ({TARGET_RATIO * base_ms:.1f} ms)",
                passed=ratio <= TARGET_RATIO,
            )
        ],
        baseline=latency_baseline(
            "git worktree add -b + Popen of the same agent, until Popen returns", base
        ),
        ratio=ratio,
        ratio_label="gridd median / baseline median",
        figures={
            "runs": runs,
            "gridd_ms": ms_summary(gridd),
            "agent": TRIVIAL_AGENT,
        },
        quick=quick,
        summary=f"median {gridd_ms:.1f} ms (min {min(gridd) * 1000:.1f}, max"
        f" {max(gridd) * 1000:.1f}); worktree add + Popen {base_ms:.1f} ms; ratio {ratio:.2f}",
        notes="one task at a time, each run left to complete before the next; first spawn"
        " is a warm-up and not counted",
    )
