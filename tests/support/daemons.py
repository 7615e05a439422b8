"""Starting gridd for a test. One way, with options:

- ``running_daemon(root, *, env=, wait=, stop_agents=)``: a real ``gridd`` process for the
  ``with`` block; ``stop_agents=True`` force-stops the session first and leaves no agent
  behind (``core_daemon`` is that preset). ``start_daemon`` is its unmanaged first half.
- ``restartable_daemon(root, *, env=)``: the same process behind a handle the test may
  kill, stop and start again.
- ``inprocess_daemon(root, config=, executor=)``: the same composition served inside the
  test's event loop, for tests that publish straight onto the bus.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridd.client import GridClient
from tests.support.api import socket_answers
from tests.support.cli import GRIDCTL, GRIDD
from tests.support.git import git
from tests.support.processes import daemons_serving, kill_workspace_agents
from tests.support.waits import wait_for


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
    """Start ``gridd`` for ``root`` (``wait``: until it answers ``/health``); the caller stops it."""
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


def _stop_session(daemon: DaemonProc) -> None:
    if daemon.proc.poll() is None:
        with contextlib.suppress(Exception), daemon.client() as c:
            c.post("/session/stop", params={"force": "1"})
            wait_for(lambda: not c.get("/agents"), timeout=15, interval=0.1)


@contextmanager
def running_daemon(
    root: Path,
    *,
    wait: bool = True,
    env: dict[str, str] | None = None,
    stop_agents: bool = False,
) -> Iterator[DaemonProc]:
    """A real ``gridd`` serving ``root`` for the block, stopped with SIGTERM afterwards.

    ``stop_agents``: force-stop the session before the daemon and SIGKILL any agent of
    the workspace still running at the end."""
    try:
        daemon = start_daemon(root, wait=wait, env=env)
        try:
            yield daemon
        except BaseException:
            # A failing test shows what the daemon logged: a flake seen once in CI is then
            # diagnosable from the CI output alone.
            print(f"--- the last lines of {daemon.grid_dir / 'gridd.log'} ---")
            print("\n".join(daemon.stderr_text().splitlines()[-80:]))
            raise
        finally:
            if stop_agents:
                _stop_session(daemon)
            for c in daemon.clients:
                c.close()
            if daemon.proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    daemon.stop(timeout=10)
    finally:
        if stop_agents:
            kill_workspace_agents(root)


def core_daemon(
    root: Path, *, wait: bool = True, env: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[DaemonProc]:
    """``running_daemon(..., stop_agents=True)``: for tests that run agents."""
    return running_daemon(root, wait=wait, env=env, stop_agents=True)


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
def restartable_daemon(root: Path, *, env: dict[str, str] | None = None) -> Iterator[Restartable]:
    """A started daemon that the test may replace; everything is cleaned up afterwards."""
    handle = Restartable(root, env=env)
    try:
        handle.start()
        yield handle
    finally:
        handle.close()


@dataclass
class InProcessDaemon:
    """The real app on a real uvicorn server and socket, inside the test's event loop, so a
    test can publish events straight onto the bus."""

    grid: Any  # gridd.grid.Grid
    sock: Path
    server: Any  # gridd.daemon._Server


@contextlib.asynccontextmanager
async def inprocess_daemon(
    root: Path, config: dict | None = None, executor=None
) -> AsyncIterator[InProcessDaemon]:  # type: ignore[no-untyped-def,type-arg]
    """Serve ``root`` from this process: same composition as gridd, no signal handlers
    (``executor``: another executor than the local shim one, at the seam)."""
    import asyncio

    from gridd.compose import compose
    from gridd.daemon import bind_socket, build_server
    from gridd.settings import parse_settings
    from gridd.store import Store
    from gridd.workspace import Workspace

    ws = Workspace(root=root)
    ws.ensure_grid_dir()
    settings = parse_settings(config or {})
    store = Store.open(ws.db_path)
    grid = compose(
        workspace=ws, settings=settings, store=store, environ=os.environ, executor=executor
    )
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
    gitdir = Path(git(worktree, "rev-parse", "--absolute-git-dir").strip())
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
