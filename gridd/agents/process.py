"""The daemon's handle on one agent: its run directory, its shim, and its process group.

A process is identified by (pid, create time), never by pid alone: a signal is only sent
after psutil confirms the pid still belongs to the process we started.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import marshal
import os
import signal
import struct
import termios
from pathlib import Path
from typing import Any

from gridd.agents.executor import ExitStatus
from gridd.agents.starter import ForkedShim, LaunchedShim, ShimStarter
from gridd.errors import Conflict, GriddError

__all__ = ["AgentProcess", "ExitStatus", "ShimStarter", "SpawnError"]


class SpawnError(GriddError):
    code = "spawn_failed"
    transient = True


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def process_create_time(pid: int) -> float | None:
    import psutil  # on first use: a daemon with no agent never needs it (~60 ms of start-up)

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _same_process(pid: int | None, create_time: float | None) -> bool:
    if pid is None or create_time is None:
        return False
    current = process_create_time(pid)
    if current is None or abs(current - create_time) > 0.01:
        return False
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def _until_eof(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            return
        if not data and not done.done():
            done.set_result(None)

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` (0600) with ``data``. Never over an existing file: a spec already in
    the run directory is another run's, kept as it is (``FileExistsError`` fails the spawn)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _pipe_room(fd: int) -> int | None:
    """Free bytes in the pipe behind ``fd`` (Linux), or None where the OS cannot say."""
    size_op = getattr(fcntl, "F_GETPIPE_SZ", None)
    if size_op is None:
        return None
    try:
        capacity = fcntl.fcntl(fd, size_op)
        queued = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return None
    return int(capacity) - int(queued)


class AgentProcess:
    """(pid, create time) of the agent and of its shim, plus the run directory."""

    def __init__(
        self,
        run_dir: Path,
        pid: int | None,
        create_time: float | None,
        *,
        shim_pid: int | None = None,
        shim_create_time: float | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.pid = pid
        self.create_time = create_time
        self.shim_pid = shim_pid
        self.shim_create_time = shim_create_time

    @classmethod
    async def spawn(
        cls,
        run_dir: Path,
        *,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        stdin: str = "pipe",
        timeout: float = 10.0,
        starter: ShimStarter | None = None,
    ) -> AgentProcess:
        """Hand the run to a shim (a spare one already started, when ``starter`` has it)
        and wait until the agent runs. ``run_dir`` is a new one (the pool makes it empty);
        one that already holds a run's spec is refused (``FileExistsError``), not reused."""
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        spec = {"argv": argv, "cwd": str(cwd), "env": env, "stdin": stdin}
        # 0600: the spec holds the agent's whole environment, API keys included. The shim
        # reads the marshal form (no json import at its start-up); spec.json is for people,
        # with the environment's names only.
        _write_private(run_dir / "spec.marshal", marshal.dumps(spec))
        readable = {**spec, "env": sorted(env)}
        _write_private(run_dir / "spec.json", json.dumps(readable, indent=1).encode())
        shim: LaunchedShim | ForkedShim = (
            starter.take() if starter else None
        ) or LaunchedShim.launch(run_dir / "shim.log")
        loop = asyncio.get_running_loop()
        try:
            try:
                shim.go(run_dir)
            except OSError:
                if not isinstance(shim, ForkedShim) or starter is None:
                    raise
                starter.server_failed()
                shim.close()
                shim = LaunchedShim.launch(run_dir / "shim.log")
                shim.go(run_dir)
            # The shim closes its end of the ready pipe once agent.json (or exit.json) is
            # written: EOF wakes us at that instant, with no polling.
            await asyncio.wait_for(_until_eof(loop, shim.ready_r), timeout)
        except TimeoutError:
            pass  # judged below from what the shim wrote
        finally:
            shim.close()
        await shim.reap_launcher()
        deadline = loop.time() + 0.5
        handle = cls(run_dir, None, None)
        while True:
            info = read_json(run_dir / "agent.json")
            if info is not None:
                handle.pid = int(info["pid"])
                handle.create_time = process_create_time(handle.pid)
                handle.shim_pid = int(info["shimPid"])
                handle.shim_create_time = process_create_time(handle.shim_pid)
                return handle
            if (run_dir / "exit.json").exists():
                return handle  # the command could not even start; exit.json says why
            if loop.time() > deadline or shim.failed:
                log_text = (run_dir / "shim.log").read_text(errors="replace")[-2000:]
                raise SpawnError(
                    f"agent supervisor did not start the agent: {log_text.strip() or 'no output'}",
                    details={"runDir": str(run_dir)},
                )
            await asyncio.sleep(0.003)

    @classmethod
    def adopt(cls, run_dir: Path, *, not_before: float) -> AgentProcess | None:
        """The handle of a run whose daemon died before it recorded the pids, from the
        shim's ``agent.json``. A pid only counts when its process was created between
        ``not_before`` (epoch seconds: when the run was recorded) and the shim's start
        stamp; otherwise the number belongs to someone else now."""
        info = read_json(run_dir / "agent.json")
        if info is None:
            return None
        try:
            pid, shim_pid = int(info["pid"]), int(info["shimPid"])
            latest = float(info["startedAt"]) + 1.0
        except (KeyError, TypeError, ValueError):
            return None

        def created(p: int) -> float | None:
            when = process_create_time(p)
            return when if when is not None and not_before - 1.0 <= when <= latest else None

        return cls(
            run_dir, pid, created(pid), shim_pid=shim_pid, shim_create_time=created(shim_pid)
        )

    # -- observation -----------------------------------------------------------------------

    def exit_status(self) -> ExitStatus | None:
        data = read_json(self.run_dir / "exit.json")
        if data is None:
            return None
        return ExitStatus(data.get("exitCode"), data.get("signal"), data.get("error"))

    def alive(self) -> bool:
        """True while our agent (same pid *and* create time) still exists."""
        return _same_process(self.pid, self.create_time)

    def group_alive(self) -> bool:
        """True while any process of the agent's process group remains: the agent itself, or
        children it left behind. The group id is the agent's pid, and Linux does not give that
        number to a new process while the group still has members."""
        if self.pid is None or self.create_time is None:
            return False
        if self.alive():
            return True
        current = process_create_time(self.pid)
        if current is not None and abs(current - self.create_time) > 0.01:
            # The number went to another process, so our group had emptied first; a group
            # with this id now is that process's own (e.g. another agent's), never ours.
            return False
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def shim_alive(self) -> bool:
        """True while the shim (same pid and create time) still runs."""
        return _same_process(self.shim_pid, self.shim_create_time)

    # -- control --------------------------------------------------------------------------------

    def signal(self, sig: int) -> bool:
        """Signal the agent's whole process group; False when all of it is already gone."""
        if not self.group_alive():
            return False
        assert self.pid is not None
        try:
            os.killpg(self.pid, sig)
            if sig in (signal.SIGTERM, signal.SIGINT):
                os.killpg(self.pid, signal.SIGCONT)  # a stopped process cannot act on TERM
        except ProcessLookupError:
            return False
        return True

    def close_stdin(self) -> bool:
        """Close the agent's stdin (the shim lets go of its writer: SIGUSR1), so it reads EOF
        once what was written is read. False when the shim is gone (nothing to close)."""
        if not self.shim_alive():
            return False
        assert self.shim_pid is not None
        try:
            os.kill(self.shim_pid, signal.SIGUSR1)
        except ProcessLookupError:
            return False
        return True

    def write_stdin(self, text: str) -> None:
        fifo = self.run_dir / "stdin"
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ENOENT):
                raise Conflict(
                    "the agent is not reading its stdin (it has exited or uses stdin=null)",
                    code="agent_not_listening",
                ) from None
            raise
        try:
            data = text.encode() if text.endswith("\n") else (text + "\n").encode()
            room = _pipe_room(fd)
            if room is not None and len(data) > room:
                # Refuse before writing anything: half a line would corrupt the protocol.
                raise Conflict(
                    f"the agent's stdin has room for {room} bytes, the message is {len(data)};"
                    " it is not reading what it was sent",
                    code="stdin_full",
                    details={"room": room, "size": len(data)},
                )
            written = os.write(fd, data)
            if written != len(data):
                raise Conflict(
                    f"only {written} of {len(data)} bytes reached the agent's stdin",
                    code="stdin_full",
                )
        except BlockingIOError:
            raise Conflict(
                "the agent's stdin is full; it is not reading", code="stdin_full"
            ) from None
        finally:
            os.close(fd)
