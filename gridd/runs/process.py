"""The daemon's handle on one agent: its run directory, its shim, and its process group.

A process is identified by (pid, create time), never by pid alone: a signal is only sent
after psutil confirms the pid still belongs to the process we started.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import marshal
import os
import signal
import struct
import termios
from pathlib import Path
from typing import Any

from gridd.errors import Conflict, GriddError
from gridd.runs.executor import ExitStatus
from gridd.runs.shim import CLAIM
from gridd.runs.starter import ForkedShim, LaunchedShim, ShimStarter

__all__ = ["AgentProcess", "ExitStatus", "ShimStarter", "SpawnError", "fence_run"]

log = logging.getLogger(__name__)

#: How a claim taken by a daemon (not by a shim) starts.
FENCED = "fenced"
#: A spawn given up on while its shim holds the claim: how often we look again.
CLAIMANT_POLL_SECONDS = 0.05


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


def fence_run(run_dir: Path, why: str) -> bool:
    """Take the run's ``claim`` (created exclusively) before its shim does: then no shim
    will ever start it, however late it comes. True when the run is fenced (by us now, or
    by a daemon before), False when its shim took it first (it runs, or is about to)."""
    path = run_dir / CLAIM
    try:
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text(errors="replace").startswith(FENCED)
    try:
        os.write(fd, f"{FENCED}: {why} (daemon {os.getpid()})\n".encode())
    finally:
        os.close(fd)
    return True


def _claimant(run_dir: Path) -> tuple[int, float] | None:
    """(pid, claim time) of the shim that claimed the run, from its ``claim`` file."""
    path = run_dir / CLAIM
    try:
        text = path.read_text(errors="replace")
        claimed_at = path.stat().st_mtime
    except OSError:
        return None
    word, _, pid = text.strip().partition(" ")
    return (int(pid), claimed_at) if word == "shim" and pid.isdigit() else None


def _claimant_alive(claimant: tuple[int, float]) -> bool:
    """True while the shim that claimed the run lives (a pid created after the claim is
    someone else's)."""
    pid, claimed_at = claimant
    created = process_create_time(pid)
    if created is None or created > claimed_at + 1.0:
        return False
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _log_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-2000:].strip()
    except OSError:
        return ""


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


#: The lines of ``/proc/<pid>/status`` naming the signals a process ignores and catches.
_MASKS = ("SigIgn:", "SigCgt:")


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
        self.where: dict[str, str] = {}

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
        grid_dir: Path | None = None,
        orphan_grace: float = 60.0,
        sandbox: dict[str, object] | None = None,
    ) -> AgentProcess:
        """Hand the run to a shim (a spare one already started, when ``starter`` has it)
        and wait until the agent runs. ``run_dir`` is a new one (the pool makes it empty);
        one that already holds a run's spec is refused (``FileExistsError``), not reused.
        ``grid_dir``: the workspace's ``.grid/``; should it be deleted or replaced, the shim
        stops the agent ``orphan_grace`` seconds later (``shim.WorkspaceWatch``).
        ``sandbox``: what the shim binds the agent to before ``exec`` (``landlock_rules.enforce``)."""
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        spec: dict[str, object] = {"argv": argv, "cwd": str(cwd), "env": env, "stdin": stdin}
        if grid_dir is not None:
            spec |= {"grid": str(grid_dir), "orphan_grace": orphan_grace}
        if sandbox is not None:
            spec["sandbox"] = sandbox
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
        while not handle._settled():
            if loop.time() > deadline or shim.failed:
                # Given up on: fence the run, so that a shim that comes late (a stopped,
                # slow or restarting shim server) can never start it; or learn that its
                # shim took it first, and then it is ours to track, however long it takes.
                why = f"abandoned: the agent did not start within {timeout:g}s"
                if fence_run(run_dir, why):
                    if isinstance(shim, ForkedShim) and starter is not None:
                        starter.server_failed()  # spares from now on: this server lags
                    raise SpawnError(
                        f"agent supervisor did not start the agent within {timeout:g}s; the"
                        f" run is fenced and will never start:"
                        f" {_log_tail(run_dir / 'shim.log') or 'no output'}",
                        details={"runDir": str(run_dir)},
                    )
                await handle._await_claimant(timeout)
                break
            await asyncio.sleep(0.003)
        return handle

    def _settled(self) -> bool:
        """True once the shim said the agent runs (``agent.json``: the pids are taken from
        it) or could not start (``exit.json``)."""
        return self._pick_up() or (self.run_dir / "exit.json").exists()

    def _pick_up(self) -> bool:
        """Take the pids from ``agent.json`` once the shim has written it (a handle made
        before the agent ran: ``spawn``, or ``adopt`` of a run its shim claimed). True when
        the pids are known."""
        if self.pid is not None:
            return True
        info = read_json(self.run_dir / "agent.json")
        if info is None:
            return False
        self.pid = int(info["pid"])
        self.create_time = process_create_time(self.pid)
        self.shim_pid = int(info["shimPid"])
        self.shim_create_time = process_create_time(self.shim_pid)
        return True

    async def _await_claimant(self, timeout: float) -> None:
        """The run's shim claimed it before we gave up: it starts the agent, or is about to
        (it may be stopped, or slow). Wait for it to say so for as long as it lives: a
        second run of the task must not start meanwhile. Gone without a word, it failed."""
        log.warning(
            "agent supervisor of %s claimed the run but has not started the agent within"
            " %gs; waiting for it",
            self.run_dir,
            timeout,
        )
        claimant = _claimant(self.run_dir)
        while not self._settled():
            if claimant is None or not _claimant_alive(claimant):
                if self._settled():  # it writes its record just before it exits
                    return
                raise SpawnError(
                    "agent supervisor took the run and exited without starting the agent:"
                    f" {_log_tail(self.run_dir / 'shim.log') or 'no output'}",
                    details={"runDir": str(self.run_dir)},
                )
            await asyncio.sleep(CLAIMANT_POLL_SECONDS)

    @classmethod
    def adopt(cls, run_dir: Path, *, not_before: float) -> AgentProcess | None:
        """The handle of a run whose daemon died before it recorded the pids, from the
        shim's ``agent.json``. A pid only counts when its process was created between
        ``not_before`` (epoch seconds: when the run was recorded) and the shim's start
        stamp; otherwise the number belongs to someone else now."""
        info = read_json(run_dir / "agent.json")
        if info is None:
            return cls._claimed(run_dir)
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

    @classmethod
    def _claimed(cls, run_dir: Path) -> AgentProcess | None:
        """A run whose shim claimed it but has not said the agent runs (it is stopped, or
        slow): the shim's handle, so that the run is watched, and no second one started,
        while that shim lives. The agent's pids are taken once it writes them."""
        claimant = _claimant(run_dir)
        if claimant is None or not _claimant_alive(claimant):
            return None
        pid = claimant[0]
        return cls(run_dir, None, None, shim_pid=pid, shim_create_time=process_create_time(pid))

    # -- observation -----------------------------------------------------------------------

    def exit_status(self) -> ExitStatus | None:
        data = read_json(self.run_dir / "exit.json")
        if data is None:
            return None
        return ExitStatus(data.get("exitCode"), data.get("signal"), data.get("error"))

    def alive(self) -> bool:
        """True while our agent (same pid *and* create time) still exists."""
        self._pick_up()
        return _same_process(self.pid, self.create_time)

    def group_alive(self) -> bool:
        """True while any process of the agent's process group remains: the agent itself, or
        children it left behind. The group id is the agent's pid, and Linux does not give that
        number to a new process while the group still has members."""
        self._pick_up()
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

    def handles_signal(self, sig: int) -> bool:
        """Linux's ``SigCgt``/``SigIgn`` of the agent; SIGKILL never; True where the masks
        cannot be read (another OS, the process gone)."""
        if sig == signal.SIGKILL:
            return False
        try:
            with open(f"/proc/{self.pid}/status") as fh:
                masks = [int(line.split()[1], 16) for line in fh if line.startswith(_MASKS)]
        except (OSError, ValueError, IndexError):
            return True
        if len(masks) != len(_MASKS):
            return True
        return any(mask & (1 << (sig - 1)) for mask in masks)

    def close_stdin(self) -> bool:
        """Close the agent's stdin (the shim lets go of its writer: SIGUSR1), so it reads EOF
        once what was written is read. False when the shim is gone, or the agent has no
        stdin pipe (``stdin = "null"``: a shim that holds none would die of SIGUSR1)."""
        if not self.shim_alive() or not (self.run_dir / "stdin").exists():
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
