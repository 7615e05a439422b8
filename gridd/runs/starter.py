"""Starting shims cheaply: a shim server that forks one per run, or a spare shim started
ahead of need, so a spawn does not wait for an interpreter to start.

Part of the local shim executor (``runs/local.py``); ``AgentProcess.spawn`` takes a shim
from here and hands it the run directory.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

from gridd.runs import shim

SHIM_PATH = Path(shim.__file__)


def launch_shim(log_path: Path, fds: dict[str, int]) -> subprocess.Popen[bytes]:
    """Start a detached shim (``--<name>-fd=N`` for each of ``fds``, which it inherits) in a
    session of its own, its output appended to ``log_path``. Isolated (``-I -S``): the shim
    imports nothing of gridd's or of site-packages."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                str(SHIM_PATH),
                "-",
                "--detach",
                *(f"--{name}-fd={fd}" for name, fd in fds.items()),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(fds.values()),
        )


class LaunchedShim:
    """A shim process started (detached) and waiting for the run directory it will serve.

    ``go``: we write the run directory to it and close; EOF with nothing written (the
    daemon went away) makes a waiting shim exit. ``ready``: it closes its end when the agent
    runs. Not ``asyncio.create_subprocess_exec``: asyncio kills a child whose transport is
    closed or collected, which would take the shim down with the daemon.
    """

    def __init__(self, launcher: subprocess.Popen[bytes], go_w: int, ready_r: int) -> None:
        self.launcher = launcher
        self.go_w: int | None = go_w
        self.ready_r: int = ready_r

    @classmethod
    def launch(cls, log_path: Path) -> LaunchedShim:
        go_r, go_w = os.pipe()
        ready_r, ready_w = os.pipe()
        try:
            launcher = launch_shim(log_path, {"go": go_r, "ready": ready_w})
        except BaseException:
            for fd in (go_w, ready_r):
                os.close(fd)
            raise
        finally:
            os.close(go_r)
            os.close(ready_w)
        return cls(launcher, go_w, ready_r)

    @property
    def failed(self) -> bool:
        return self.launcher.returncode not in (0, None)

    def go(self, run_dir: Path) -> None:
        assert self.go_w is not None
        try:
            os.write(self.go_w, f"{run_dir}\n".encode())
        finally:
            os.close(self.go_w)
            self.go_w = None

    def close(self) -> None:
        """Release our ends; a shim still waiting for its run directory then exits."""
        if self.go_w is not None:
            os.close(self.go_w)
            self.go_w = None
        if self.ready_r >= 0:
            os.close(self.ready_r)
            self.ready_r = -1

    async def reap_launcher(self) -> None:
        """The launcher exits right after forking the shim: collect it (no zombie)."""
        await reap(self.launcher)


async def reap(launcher: subprocess.Popen[bytes]) -> None:
    """Collect a launcher, which exits as soon as it has forked its shim away."""
    for _ in range(200):
        if launcher.poll() is not None:
            return
        await asyncio.sleep(0.005)
    launcher.kill()
    launcher.wait()


class ForkedShim:
    """A shim the shim server forks for us: the same interface as ``LaunchedShim``."""

    launcher = None

    def __init__(self, server: socket.socket) -> None:
        self.server = server
        self.ready_r, self._ready_w = os.pipe()

    @property
    def failed(self) -> bool:
        return False

    def go(self, run_dir: Path) -> None:
        try:
            socket.send_fds(self.server, [str(run_dir).encode()], [self._ready_w])
        finally:
            os.close(self._ready_w)
            self._ready_w = -1

    def close(self) -> None:
        for fd in (self.ready_r, self._ready_w):
            if fd >= 0:
                os.close(fd)
        self.ready_r = self._ready_w = -1

    async def reap_launcher(self) -> None:
        return None


class ShimStarter:
    """Makes shims cheap to start. Normally a shim server (started once, detached) forks one
    per run; should it be gone, one spare shim started ahead of need takes the run. Either
    way a spawn does not wait for an interpreter to start (the largest part of its cost)."""

    def __init__(self, spare_log: Path) -> None:
        self.spare_log = spare_log
        self._spare: LaunchedShim | None = None
        self._server: socket.socket | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    def take(self) -> LaunchedShim | ForkedShim | None:
        if self._server is not None:
            return ForkedShim(self._server)
        spare, self._spare = self._spare, None
        if not self._closed:
            asyncio.get_running_loop().call_soon(self._replenish)
        return spare

    def server_failed(self) -> None:
        """The server did not take a run: fall back to spare shims from now on."""
        if self._server is not None:
            self._server.close()
            self._server = None
            self._replenish()

    def _start_server(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            launcher = launch_shim(self.spare_log, {"control": theirs.fileno()})
        except OSError:
            ours.close()
            return
        finally:
            theirs.close()
        self._server = ours  # what we send is queued on the socket until the server reads
        # Collected in the background: waiting here held the daemon's start for as long as
        # an interpreter takes to start.
        self._reaper = asyncio.get_running_loop().create_task(reap(launcher))

    def _replenish(self) -> None:
        if self._spare is not None or self._closed:
            return
        try:
            self._spare = LaunchedShim.launch(self.spare_log)
        except OSError:
            self._spare = None  # spawns then start their own shim, a little slower
            return
        asyncio.get_running_loop().create_task(self._spare.reap_launcher())

    def start(self) -> None:
        self._start_server()
        if self._server is None:
            self._replenish()

    def close(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()  # the server sees EOF and exits
            self._server = None
        if self._spare is not None:
            self._spare.close()
            self._spare.launcher.poll()
            self._spare = None
