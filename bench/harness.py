"""A real gridd with agent profiles, driven the way the agent benchmarks drive it: a
workspace's config, a daemon that leaves no agent or shim behind, JSON requests and a raw
SSE reader over the socket, and tallies of what the agents did.

Shared by every agent benchmark (no benchmark imports another's names); the workspace
config is written with ``tests.support``'s TOML writer, as the tests write it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from bench.common import Gridd, RawHTTP, make_repo, remove_repo, running_gridd
from gridd.client import SSEEvent
from tests.support.repos import toml_value

#: A trivial agent: one file in its worktree, no output. The same argv runs in the baseline.
TRIVIAL_AGENT = ["/bin/sh", "-c", 'echo "work for $GRID_TASK_ID" > "$GRID_TASK_ID.txt"']


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
    lines = ["[scheduler]", f"default_agent = {toml_value(default_agent)}"]
    lines += [f"{k} = {toml_value(v)}" for k, v in (scheduler or {}).items()]
    for section, values in (sections or {}).items():
        lines.append(f"\n[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    for name, profile in agents.items():
        lines.append(f"\n[agents.{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in profile.items()]
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


def dechunk(raw: bytearray, out: bytearray) -> bool:
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


def parse_sse_block(block: bytes) -> SSEEvent | None:
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
                    done = dechunk(raw, payload)
                else:
                    payload += data
                pos = 0
                while (end := payload.find(b"\r\n\r\n", pos)) >= 0:
                    event = parse_sse_block(bytes(payload[pos:end]))
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


def of_task(task_id: str) -> Callable[[SSEEvent], bool]:
    """An ``EventTap`` filter: the events of ``task_id``."""
    return lambda event: bool(event.data.get("taskId") == task_id)


class AgentTally:
    """Counts completions and live agents from the event stream (in the reader thread)."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.completed = 0
        self.failed: list[dict[str, Any]] = []
        #: ``task.start_failed``: the start is retried after a backoff, so it only costs time.
        self.start_failures: list[dict[str, Any]] = []
        self.live = 0
        self.peak = 0
        self.first_spawn: float | None = None
        self.last_completed = 0.0
        self.done = threading.Event()

    def __call__(self, now: float, event: SSEEvent) -> None:
        if event.type == "agent.spawned":
            self.live += 1
            self.peak = max(self.peak, self.live)
            if self.first_spawn is None:
                self.first_spawn = now
        elif event.type in ("agent.completed", "agent.failed", "agent.stopped"):
            self.live -= 1
            if event.type == "agent.completed":
                self.completed += 1
                self.last_completed = now
            else:
                self.failed.append(event.data)
        elif event.type == "task.start_failed":
            self.start_failures.append(event.data)
        if self.completed >= self.expect or self.failed:
            self.done.set()


def peak_processes(runs_dir: Path) -> int:
    """Most agent processes alive at once, from each run's ``agent.json`` ``startedAt`` to
    its ``exit.json`` ``endedAt`` (both written by the shim). Events overstate it: a slot is
    free from the agent's exit, before its work is committed and ``agent.completed`` is
    published (as ``tests/test_core_loop.py`` measures it)."""
    spans = []
    for run in runs_dir.iterdir():
        try:
            began = json.loads((run / "agent.json").read_text())["startedAt"]
            ended = json.loads((run / "exit.json").read_text())["endedAt"]
        except (OSError, ValueError, KeyError):
            continue
        spans.append((float(began), float(ended)))
    return max((sum(1 for s, e in spans if s <= start < e) for start, _ in spans), default=0)
