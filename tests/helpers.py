"""Shared test machinery: real git repositories and real gridd processes.

Workspaces live under a short /tmp prefix because Unix socket paths are limited to
~107 bytes and pytest's tmp_path is often deeper than that.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gridd.client import GridClient
from gridd.settings import CLAUDE_PERMISSION_ARGS, CLAUDE_STREAM_ARGS

GRIDD = [sys.executable, "-m", "gridd.cli.gridd_main"]
GRIDCTL = [sys.executable, "-m", "gridd.cli.gridctl"]


def make_repo(parent: Path | None = None) -> Path:
    root = Path(tempfile.mkdtemp(prefix="g", dir=str(parent or "/tmp")))
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True, env=env)
    for key, value in (("user.email", "test@example.com"), ("user.name", "gridd tests")):
        subprocess.run(["git", "-C", str(root), "config", key, value], check=True)
    (root / "README.md").write_text("test repo\n")
    subprocess.run(["git", "-C", str(root), "add", "README.md"], check=True)
    subprocess.run(["git", "-C", str(root), "commit", "-q", "-m", "init"], check=True, env=env)
    return root


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, message: str = ""):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)


def socket_answers(sock: Path) -> bool:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=1.0) as c:
            return c.get("http://gridd/health").status_code == 200
    except (httpx.TransportError, OSError):
        return False


@dataclass
class DaemonProc:
    """A real ``gridd`` process serving ``root``."""

    root: Path
    proc: subprocess.Popen[bytes]
    clients: list[GridClient] = field(default_factory=list)

    @property
    def grid_dir(self) -> Path:
        return self.root / ".grid"

    @property
    def sock(self) -> Path:
        return self.grid_dir / "gridd.sock"

    def client(self, timeout: float = 10.0) -> GridClient:
        c = GridClient(self.sock, timeout=timeout)
        self.clients.append(c)
        return c

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stderr_text(self) -> str:
        log = self.grid_dir / "gridd.log"
        return log.read_text() if log.exists() else ""


def start_daemon(root: Path, *, wait: bool = True, env: dict[str, str] | None = None) -> DaemonProc:
    log = open(root / ".gridd-test-stderr", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [*GRIDD, "--workspace", str(root)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    log.close()
    daemon = DaemonProc(root=root, proc=proc)
    if wait:
        sock = daemon.sock
        try:
            wait_for(
                lambda: socket_answers(sock) or proc.poll() is not None,
                timeout=15,
                message="gridd to answer /health",
            )
        except AssertionError:
            proc.kill()  # a test that gives up on its daemon must not leave it running
            proc.wait()
            raise
        if proc.poll() is not None:
            out = (root / ".gridd-test-stderr").read_text()
            raise AssertionError(f"gridd exited with {proc.returncode}: {out}")
    return daemon


@contextmanager
def running_daemon(root: Path, **kwargs) -> Iterator[DaemonProc]:  # type: ignore[no-untyped-def]
    daemon = start_daemon(root, **kwargs)
    try:
        yield daemon
    except BaseException:
        # A failing test shows what the daemon logged: a flake seen once in CI is then
        # diagnosable from the CI output alone.
        print(f"--- the last lines of {daemon.grid_dir / 'gridd.log'} ---")
        print("\n".join(daemon.stderr_text().splitlines()[-80:]))
        raise
    finally:
        for c in daemon.clients:
            c.close()
        if daemon.proc.poll() is None:
            try:
                daemon.stop(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def remove_repo(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


# -- added for the daemon-foundation tests ---------------------------------------------------

import contextlib  # noqa: E402
import threading  # noqa: E402

from gridd.client import SSEEvent  # noqa: E402


def run_gridd(root: Path, *, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``gridd`` expecting it to exit by itself (a refused start); output captured."""
    return subprocess.run(
        [*GRIDD, "--workspace", str(root)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_config(root: Path, text: str) -> None:
    grid = root / ".grid"
    grid.mkdir(mode=0o700, exist_ok=True)
    (grid / "config.toml").write_text(text)


def raw_http(
    sock: Path, request: bytes, *, timeout: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes to the socket, read until the server closes; (status, headers, body)."""
    import socket as _socket

    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(request)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


@dataclass
class InProcessDaemon:
    """The real app on a real uvicorn server and socket, inside the test's event loop, so a
    test can publish events straight onto the bus."""

    grid: object  # gridd.grid.Grid
    sock: Path
    server: object  # gridd.daemon._Server


@contextlib.asynccontextmanager
async def inprocess_daemon(root: Path, config: dict | None = None, executor=None):  # type: ignore[no-untyped-def,type-arg]
    """Serve ``root`` from this process: same composition as gridd, no signal handlers
    (``executor``: another executor than the local shim one, at the seam)."""
    import asyncio

    from gridd.daemon import bind_socket, build_server
    from gridd.grid import Grid
    from gridd.settings import parse_settings
    from gridd.store import Store
    from gridd.workspace import Workspace

    ws = Workspace(root=root)
    ws.ensure_grid_dir()
    settings = parse_settings(config or {})
    store = Store.open(ws.db_path)
    grid = Grid(workspace=ws, settings=settings, store=store, executor=executor)
    server = build_server(grid, handle_signals=False)
    sock = bind_socket(ws.socket_path)
    await grid.start()
    task = asyncio.create_task(server.serve(sockets=[sock]), name="inprocess-uvicorn")
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while not server.started:
            if task.done():
                task.result()
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError("in-process server did not start")
            await asyncio.sleep(0.01)
        yield InProcessDaemon(grid=grid, sock=ws.socket_path, server=server)
    finally:
        grid.request_shutdown()
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        await grid.stop()
        store.close()
        ws.socket_path.unlink(missing_ok=True)


@dataclass
class SSERead:
    """What one ``GET /events`` connection delivered."""

    events: list[SSEEvent] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    ended: bool = False  # the daemon closed the stream (as opposed to us stopping)

    @property
    def ids(self) -> list[int]:
        """Ids of log events (snapshots and resets repeat the position, so they are left out)."""
        return [
            e.id
            for e in self.events
            if e.id is not None and e.type not in {"state.snapshot", "reset"}
        ]

    def types(self) -> list[str]:
        return [e.type for e in self.events]


def read_sse(  # type: ignore[no-untyped-def]
    sock: Path,
    *,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    until=None,
    timeout: float = 15.0,
    started: threading.Event | None = None,
) -> SSERead:
    """Read ``GET /events`` until ``until(read)`` holds or the daemon ends the stream.

    Fails (AssertionError) when neither happens within ``timeout`` seconds.
    """
    from gridd.client import SSEParser

    read = SSERead()
    deadline = time.monotonic() + timeout
    parser = SSEParser()
    transport = httpx.HTTPTransport(uds=str(sock))
    http = httpx.Client(transport=transport, base_url="http://gridd")
    stream = http.stream(
        "GET", "/events", params=params, headers=headers, timeout=httpx.Timeout(10.0, read=timeout)
    )
    with http, stream as response:
        assert response.status_code == 200, response.read()
        if started is not None:
            started.set()
        try:
            for line in response.iter_lines():
                if line.startswith(":"):
                    read.comments.append(line)
                event = parser.feed_line(line)
                if event is not None:
                    read.events.append(event)
                if until is not None and until(read):
                    return read
                if time.monotonic() > deadline:
                    break
            else:
                read.ended = True
                return read
        except (httpx.RemoteProtocolError, httpx.ReadError):
            read.ended = True
            return read
        except httpx.ReadTimeout:
            pass
    raise AssertionError(f"SSE stream gave no result within {timeout}s; got {read.types()}")


# -- added for the core-loop tests (tasks, plans, scheduler, agents) ---------------------------

import json  # noqa: E402

import psutil  # noqa: E402

#: Small executable agents used by the core-loop tests.
AGENTS_DIR = Path(__file__).resolve().parent / "agents"

#: Scheduler settings that keep the core-loop tests quick.
FAST_SCHEDULER: dict[str, object] = {
    "backoff_seconds": 0.1,
    "backoff_max_seconds": 0.5,
    "stop_grace_seconds": 1.0,
    "tick_seconds": 0.25,
}


def agent_command(script: str, *args: str) -> list[str]:
    """argv running ``tests/agents/<script>`` with this interpreter."""
    return [sys.executable, str(AGENTS_DIR / script), *args]


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def write_core_config(
    root: Path,
    *,
    agents: dict[str, dict[str, object]] | None = None,
    scheduler: dict[str, object] | None = None,
) -> None:
    """``.grid/config.toml`` with agent profiles and (fast by default) scheduler settings."""
    lines = ["[scheduler]"]
    lines += [f"{k} = {_toml(v)}" for k, v in {**FAST_SCHEDULER, **(scheduler or {})}.items()]
    for name, profile in (agents or {}).items():
        lines.append(f"\n[agents.{name}]")
        lines += [f"{k} = {_toml(v)}" for k, v in profile.items()]
    write_config(root, "\n".join(lines) + "\n")


def event_log(
    client: GridClient, *, types: set[str] | None = None, timeout: float = 15.0
) -> list[SSEEvent]:
    """Every event logged so far, oldest first, replayed from the durable log."""
    last = int(client.get("/state")["daemon"]["lastEventId"])
    out: list[SSEEvent] = []
    if last == 0:
        return out
    stream = client.events(since=0, read_timeout=timeout)
    try:
        for event in stream:
            if event.id is None:
                continue
            if types is None or event.type in types:
                out.append(event)
            if event.id >= last:
                return out
    finally:
        stream.close()  # type: ignore[attr-defined]
    raise AssertionError(f"event replay ended before event {last}")


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie nobody reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_workspace_agents(root: Path) -> list[int]:
    """SIGKILL every process that runs as a gridd agent of ``root`` (teardown safety net)."""
    workspace = str(root.resolve())
    killed = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.environ().get("GRID_WORKSPACE") != workspace:
                continue
            proc.kill()
            killed.append(proc.pid)
        except psutil.Error:
            continue
    return killed


@contextmanager
def core_daemon(root: Path, **kwargs) -> Iterator[DaemonProc]:  # type: ignore[no-untyped-def]
    """``running_daemon`` that force-stops the session first and leaves no agent behind."""
    try:
        with running_daemon(root, **kwargs) as daemon:
            try:
                yield daemon
            finally:
                if daemon.proc.poll() is None:
                    with contextlib.suppress(Exception), daemon.client() as c:
                        c.post("/session/stop", params={"force": "1"})
                        wait_for(lambda: not c.get("/agents"), timeout=15, interval=0.1)
    finally:
        kill_workspace_agents(root)


def wait_for_events(
    client: GridClient, types: set[str], count: int, *, timeout: float = 30.0
) -> list[SSEEvent]:
    """The logged events of ``types`` once there are at least ``count`` of them."""
    events: list[SSEEvent] = wait_for(
        lambda: (found := event_log(client, types=types)) and len(found) >= count and found,
        timeout=timeout,
        interval=0.1,
        message=f"{count} event(s) of {sorted(types)}",
    )
    return events


def wait_task_status(
    client: GridClient, task_id: str, wanted: str, *, timeout: float = 30.0
) -> dict[str, object]:
    """The task (as ``GET /tasks/{id}`` shows it) once its status is ``wanted``."""

    def check() -> dict[str, object] | None:
        task: dict[str, object] = client.get(f"/tasks/{task_id}")
        return task if task["status"] == wanted else None

    found: dict[str, object] = wait_for(
        check, timeout=timeout, message=f"task {task_id} to be {wanted}"
    )
    return found


def read_json_file(path: Path) -> dict[str, object] | None:
    """A JSON object written (atomically) by an agent, or None while it is not there yet."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_text_file(path: Path) -> str | None:
    """A file's text, or None while it is missing or empty."""
    try:
        return path.read_text() or None
    except FileNotFoundError:
        return None


# -- added for the question/answer tests (talking to agents) -----------------------------------

#: The fake ``claude`` executable that speaks stream-json (tests/fakes/claude).
FAKE_CLAUDE = Path(__file__).resolve().parent / "fakes" / "claude"


def fake_claude_profile(
    *, stdio: bool = True, env: dict[str, str] | None = None
) -> dict[str, object]:
    """An agent profile running the fake claude as gridd runs the real one (``stdio``: with
    ``--permission-prompt-tool stdio``, so every question comes as a control request)."""
    command = [sys.executable, str(FAKE_CLAUDE), *CLAUDE_STREAM_ARGS]
    profile: dict[str, object] = {"adapter": "claude", "stdin": "pipe"}
    if stdio:
        command += CLAUDE_PERMISSION_ARGS
        profile["adapter_options"] = {"permission_prompt_tool": "stdio"}
    profile["command"] = command
    if env:
        profile["env"] = env
    return profile


def api_call(
    sock: Path, method: str, path: str, body: object = None, *, timeout: float = 10.0
) -> tuple[int, object]:
    """(status, JSON body) of one request, whatever the status (no exception for 4xx)."""
    transport = httpx.HTTPTransport(uds=str(sock))
    with httpx.Client(transport=transport, base_url="http://gridd", timeout=timeout) as http:
        response = http.request(method, path, json=body)
    return response.status_code, (response.json() if response.content else None)


def scheduler_starts(client: GridClient) -> list[str]:
    """Reconcile once, now (``POST /scheduler/step``), and return the task ids it started.

    The way to assert that nothing starts: ask the scheduler for its decision instead of
    sleeping through a few ticks and hoping one of them looked."""
    step = client.post("/scheduler/step")
    return [str(a["taskId"]) for a in step["actions"] if a["action"] == "start"]


def wait_pending_question(
    client: GridClient, task_id: str, *, timeout: float = 30.0
) -> dict[str, object]:
    """The first pending question of ``task_id`` (``GET /questions``), once there is one."""

    def check() -> dict[str, object] | None:
        for question in client.get("/questions"):
            if question["taskId"] == task_id:
                return question  # type: ignore[no-any-return]
        return None

    found: dict[str, object] = wait_for(
        check, timeout=timeout, interval=0.05, message=f"a pending question from {task_id}"
    )
    return found


def git_show(root: Path, rev_path: str) -> str | None:
    """``git show REV:PATH`` in ``root``, or None when there is no such file."""
    done = subprocess.run(
        ["git", "-C", str(root), "show", rev_path], capture_output=True, text=True, check=False
    )
    return done.stdout if done.returncode == 0 else None


# -- added for the durability tests (agents outlive the daemon, health, budgets) -----------------


class EventFollower:
    """One SSE client that follows ``GET /events`` in a thread for the whole test, and
    resumes with ``Last-Event-ID`` (its last seen id) whenever the stream breaks: the
    daemon was killed, stopped or restarted. Snapshots and resets are kept apart."""

    def __init__(self, sock: Path, *, since: int = 0, read_timeout: float = 2.0) -> None:
        self.sock = sock
        self.last_id = since
        self.read_timeout = read_timeout
        self.events: list[SSEEvent] = []
        self.other: list[SSEEvent] = []  # state.snapshot and reset
        self.connections = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-follower", daemon=True)

    def __enter__(self) -> EventFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.read_timeout + 10)

    def snapshot(self) -> list[SSEEvent]:
        with self._lock:
            return list(self.events)

    def wait(self, predicate, timeout: float = 30.0, message: str = ""):  # type: ignore[no-untyped-def]
        """Wait until ``predicate(events so far)`` is true; returns its value."""
        return wait_for(
            lambda: predicate(self.snapshot()), timeout=timeout, interval=0.05, message=message
        )

    def _run(self) -> None:
        from gridd.client import SSEParser

        while not self._stop.is_set():
            try:
                transport = httpx.HTTPTransport(uds=str(self.sock))
                with (
                    httpx.Client(transport=transport, base_url="http://gridd") as http,
                    http.stream(
                        "GET",
                        "/events",
                        headers={"Last-Event-ID": str(self.last_id)},
                        timeout=httpx.Timeout(5.0, read=self.read_timeout),
                    ) as response,
                ):
                    if response.status_code != 200:
                        raise httpx.TransportError(f"status {response.status_code}")
                    self.connections += 1
                    parser = SSEParser()
                    for line in response.iter_lines():
                        event = parser.feed_line(line)
                        if event is None:
                            continue
                        with self._lock:
                            if event.type in {"state.snapshot", "reset"} or event.id is None:
                                self.other.append(event)
                            else:
                                self.events.append(event)
                                self.last_id = event.id
                        if self._stop.is_set():
                            return
            except (httpx.TransportError, OSError):
                pass
            self._stop.wait(0.05)


def output_chunks(client: GridClient, agent_id: str, *, limit: int = 50) -> list[dict[str, object]]:
    """Every output chunk of an agent through ``GET /agents/{id}/output``, page by page."""
    chunks: list[dict[str, object]] = []
    since = 0
    while True:
        page = client.get(f"/agents/{agent_id}/output", params={"since": since, "limit": limit})
        chunks += page["chunks"]
        if not page["chunks"]:
            return chunks
        since = int(page["chunks"][-1]["seq"])


def open_fds(pid: int) -> int:
    return int(psutil.Process(pid).num_fds())


def zombie_children(pid: int) -> list[int]:
    """Children of ``pid`` (at any depth) that exited and were never reaped."""
    zombies = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() == psutil.STATUS_ZOMBIE:
                zombies.append(child.pid)
    return zombies


GRIDCTL_ENV = {**os.environ, "COLUMNS": "200"}


def gridctl(
    root: Path,
    *args: str,
    cwd: Path | None = None,
    timeout: float = 30,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``gridctl ARGS`` run in ``root`` (or ``cwd``), stdin not a terminal, output captured."""
    return subprocess.run(
        [*GRIDCTL, *args],
        cwd=cwd or root,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or GRIDCTL_ENV,
        check=False,
    )


def touch(path: Path) -> None:
    path.write_text("")


class Restartable:
    """The workspace's current daemon, which a test may kill, stop and start again."""

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.env = env
        self.daemon: DaemonProc | None = None
        self._client: GridClient | None = None

    @property
    def sock(self) -> Path:
        return self.root / ".grid" / "gridd.sock"

    def start(self) -> DaemonProc:
        self.daemon = start_daemon(self.root, env=self.env)
        return self.daemon

    def client(self) -> GridClient:
        """A client on the socket; it reconnects by itself after a restart."""
        if self._client is None:
            self._client = GridClient(self.sock, timeout=15.0)
        return self._client

    def kill9(self) -> None:
        assert self.daemon is not None
        self.daemon.kill9()

    def stop(self) -> None:
        assert self.daemon is not None
        self.daemon.stop(timeout=20)

    def close(self) -> None:
        """Force-stop the session, end leftover agents, stop whichever daemon answers."""
        try:
            if socket_answers(self.sock):
                with contextlib.suppress(Exception), GridClient(self.sock, timeout=10) as c:
                    c.post("/session/stop", params={"force": "1"})
                    wait_for(lambda: not c.get("/agents"), timeout=15, interval=0.1)
                with contextlib.suppress(Exception), GridClient(self.sock, timeout=10) as c:
                    c.post("/shutdown")
                wait_for(lambda: not socket_answers(self.sock), timeout=15, interval=0.1)
        except AssertionError:
            pass
        finally:
            if self._client is not None:
                self._client.close()
            if self.daemon is not None and self.daemon.proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.daemon.stop(timeout=10)
            kill_workspace_agents(self.root)


@contextmanager
def restartable_daemon(root: Path, **kwargs) -> Iterator[Restartable]:  # type: ignore[no-untyped-def]
    """A started daemon that the test may replace; everything is cleaned up afterwards."""
    handle = Restartable(root, **kwargs)
    try:
        handle.start()
        yield handle
    finally:
        handle.close()


def daemons_serving(root: Path) -> list[psutil.Process]:
    """Live gridd processes whose command line names ``root``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if (
            proc.info["status"] != psutil.STATUS_ZOMBIE
            and "gridd.cli.gridd_main" in cmdline
            and str(root) in cmdline
        ):
            found.append(proc)
    return found


def stop_workspace(root: Path) -> None:
    """Stop whatever a test started in ``root``: its daemon (politely, then not) and agents."""
    subprocess.run(
        [*GRIDCTL, "--workspace", str(root), "daemon", "stop"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    for proc in daemons_serving(root):
        proc.kill()
        proc.wait(5)
    kill_workspace_agents(root)


def kill9_between_exit_and_commit(
    grid: Restartable, client: GridClient, worktree: Path, go: Path, task_id: str
) -> None:
    """Kill -9 the daemon after ``task_id``'s agent exited and before its work is committed,
    then start it again. The worktree's index lock is held so the commit after the exit
    fails (a transient git error, retried): ``go`` lets the agent finish, and the daemon is
    killed once its log shows the refused commit, with the task still ``working``."""
    gitdir = Path(
        subprocess.run(
            ["git", "-C", str(worktree), "rev-parse", "--absolute-git-dir"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    lock = gitdir / "index.lock"
    lock.write_text("")
    go.write_text("")
    log = grid.root / ".grid" / "gridd.log"
    wait_for(
        lambda: log.exists() and "index.lock" in log.read_text(errors="replace"),
        timeout=30,
        message="the commit after the agent's exit refused by the held lock",
    )
    assert client.get(f"/tasks/{task_id}")["status"] == "working"
    grid.kill9()
    lock.unlink()
    grid.start()
