"""Daemon lifecycle from the client side (``gridctl daemon ...``): probe, start, stop, wait.

``gridctl`` never imports the daemon; it launches ``python -m gridd.cli.gridd_main`` as a
detached child (own session, stdin from /dev/null, stdout and stderr appended to
``.grid/gridd.out`` so a crash before logging is set up stays visible) and talks to it only
over the socket. A process is identified by (pid, create_time), never by pid alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from gridd.cli.render import duration
from gridd.client import GridClient
from gridd.errors import DaemonUnreachable, GriddError
from gridd.lockholder import flock_holder
from gridd.workspace import Workspace

#: How long ``start`` waits for the new daemon to answer ``GET /health``.
START_TIMEOUT = 5.0
#: How long ``stop`` waits for the daemon process to exit and its socket to go quiet.
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.05
#: ``.grid/gridd.out`` is moved aside to ``gridd.out.1`` before a start once it is this big.
OUT_MAX_BYTES = 1024 * 1024
OUT_TAIL_LINES = 20


@dataclass(frozen=True)
class DaemonStatus:
    """What the socket says about the daemon: pid, version and uptime, and what its
    ``/health`` says is wrong (empty when it is ok)."""

    pid: int
    version: str
    uptime: float
    problems: tuple[str, ...] = ()
    #: ``stop(agents=True)``: how many running agents the daemon stopped before it exited.
    agents_stopped: int = 0


def out_path(ws: Workspace) -> Path:
    """Where a detached daemon's own stdout and stderr go."""
    return ws.grid_dir / "gridd.out"


def probe(ws: Workspace, *, timeout: float = 2.0) -> DaemonStatus | None:
    """The running daemon's status, or None when nothing answers on the socket."""
    if not ws.socket_path.exists():
        return None
    try:
        with GridClient(ws.socket_path, timeout=timeout) as client:
            health = client.get("/health")
            version = client.get("/version")
    except DaemonUnreachable:
        return None
    parts = health.get("parts") or {}
    problems = [
        *(f"{part} is {parts.get(part, 'down')}" for part in health.get("degraded") or []),
        *(str(w) for w in health.get("warnings") or []),
    ]
    return DaemonStatus(
        pid=int(health["pid"]),
        version=str(version["version"]),
        uptime=float(health["uptime"]),
        problems=tuple(problems),
    )


def _print_problems(status: DaemonStatus) -> None:
    """A degraded daemon's reasons, under the line that says it runs."""
    for problem in status.problems:
        print(f"  degraded: {problem}")
    if status.problems:
        print("  see 'gridctl status' and 'gridctl doctor'")


def _process(pid: int) -> psutil.Process | None:
    """The live (non-zombie) process with this pid, if any."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return proc


def _same_process_alive(pid: int, created: float | None) -> bool:
    proc = _process(pid)
    if proc is None:
        return False
    try:
        return created is None or proc.create_time() == created
    except psutil.Error:
        return False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _tail(path: Path, offset: int, lines: int = OUT_TAIL_LINES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _rotate_out(path: Path) -> None:
    try:
        if path.stat().st_size > OUT_MAX_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass


def _other_daemon_starting(ws: Workspace, child_pid: int) -> bool:
    """Whether the lock file names a live process other than ``child_pid`` that holds the
    lock (by the kernel's table where it can be read; the file's word elsewhere).

    The daemon writes its pid into ``gridd.lock`` once it holds the lock. We only read it:
    taking the lock ourselves, even briefly, could make a starting daemon give up. A live
    process the file names that does not hold the lock (its pid reused, or a program other
    than gridd holding it) is not a daemon starting: the child's own refusal says who is.
    """
    named = _read_pid(ws.lock_path)
    if named is None or named == child_pid or _process(named) is None:
        return False
    try:
        holder = flock_holder(ws.lock_path)
    except OSError:  # not Linux, or the file is gone: the file's word is all there is
        return True
    return holder in (named, 0)  # 0: held from another pid namespace, cannot tell


def start(ws: Workspace) -> tuple[DaemonStatus, bool]:
    """Start gridd detached unless it already answers. Returns (status, started_by_us).

    Raises GriddError (with the tail of ``gridd.out``) when the child exits early or
    never answers within START_TIMEOUT.
    """
    current = probe(ws)
    if current is not None:
        return current, False
    ws.check_socket_path()
    ws.ensure_grid_dir()
    out = out_path(ws)
    _rotate_out(out)
    offset = out.stat().st_size if out.exists() else 0
    with out.open("ab") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "gridd.cli.gridd_main", "--workspace", str(ws.root)],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ws.root,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    exited: int | None = None
    while time.monotonic() < deadline:
        status = probe(ws, timeout=1.0)
        if status is not None:
            return status, status.pid == child.pid
        if exited is None:
            exited = child.poll()
            if exited is not None and not _other_daemon_starting(ws, child.pid):
                tail = _tail(out, offset)
                raise GriddError(
                    f"gridd exited during startup with status {exited}; see {out}"
                    + (f":\n{tail}" if tail else ""),
                    code="daemon_start_failed",
                    details={"exitStatus": exited, "out": str(out)},
                )
        time.sleep(POLL_INTERVAL)
    raise GriddError(
        f"gridd (pid {child.pid}) did not answer on {ws.socket_path} within"
        f" {START_TIMEOUT:g} s; it may still be starting: see {out} and {ws.log_path}",
        code="daemon_start_timeout",
        details={"pid": child.pid, "out": str(out), "log": str(ws.log_path)},
    )


def stop(ws: Workspace, *, agents: bool = False) -> DaemonStatus | None:
    """Ask gridd to shut down and wait until it is gone. Returns what was stopped, or None.
    ``agents``: it stops its running agents first (``POST /shutdown?agents=1``); the
    status then says how many. Without, they keep running (their shims outlive the daemon)
    and the next daemon reattaches them.

    Raises GriddError when it is still there after STOP_TIMEOUT (and, with ``agents``, the
    time the daemon says it may take to stop them), or when the pid file names a live
    process that does not answer on the socket (we will not guess and kill).
    """
    status = probe(ws)
    if status is None:
        pid = _read_pid(ws.pid_path)
        if pid is not None and _process(pid) is not None and _looks_like_gridd(pid):
            raise GriddError(
                f"{ws.pid_path} names a live gridd (pid {pid}) that does not answer on"
                f" {ws.socket_path}; it may be starting or hung (kill {pid} by hand if so)",
                code="daemon_not_answering",
                details={"pid": pid},
            )
        return None
    created = _create_time(status.pid)
    waiting = STOP_TIMEOUT
    try:
        with GridClient(ws.socket_path, timeout=5.0) as client:
            answer = client.post("/shutdown", params={"agents": "1"} if agents else None)
    except DaemonUnreachable:
        answer = None  # it went away between the probe and the request: fine, we wait below
    if agents and isinstance(answer, dict):
        status = replace(status, agents_stopped=int(answer.get("agentsStopping") or 0))
        waiting += float(answer.get("waitSeconds") or 0)
    deadline = time.monotonic() + waiting
    while time.monotonic() < deadline:
        if not _same_process_alive(status.pid, created) and probe(ws, timeout=1.0) is None:
            return status
        time.sleep(POLL_INTERVAL)
    raise GriddError(
        f"gridd (pid {status.pid}) did not stop within {waiting:g} s; see {ws.log_path}",
        code="daemon_stop_timeout",
        details={"pid": status.pid},
    )


def _create_time(pid: int) -> float | None:
    proc = _process(pid)
    try:
        return proc.create_time() if proc is not None else None
    except psutil.Error:
        return None


def _looks_like_gridd(pid: int) -> bool:
    proc = _process(pid)
    try:
        return proc is not None and any("gridd" in part for part in proc.cmdline())
    except psutil.Error:
        return False


# -- ``gridctl daemon ACTION`` ------------------------------------------------------------------

#: The actions of ``gridctl daemon``, with their help text.
ACTIONS = {
    "start": "start gridd in the background if it is not running",
    "stop": "ask gridd to shut down and wait until it has (agents keep running and are"
    " reattached by the next start; --agents stops them too)",
    "restart": "stop gridd (if running), then start it",
    "status": "say whether gridd is running (exit 3 if not), with its pid and version",
    "upgrade": "hand over to the installed gridd: check it can read the state (gridd"
    " --check-state) and adopt the running agents, then restart; agents keep running",
}


def _print_start(ws: Workspace) -> None:
    status, ours = start(ws)
    if ours:
        print(f"gridd {status.version} started for {ws.root} (pid {status.pid})")
        print(f"  log: {ws.log_path}  startup output: {out_path(ws)}")
    else:
        print(f"gridd is already running for {ws.root} (pid {status.pid}, {status.version})")
    _print_problems(status)


def _print_stop(ws: Workspace, *, agents: bool = False) -> None:
    stopped = stop(ws, agents=agents)
    if stopped is None:
        print(f"gridd is not running for {ws.root}")
        return
    print(f"gridd stopped for {ws.root} (was pid {stopped.pid})")
    if agents:
        n = stopped.agents_stopped
        print(f"  stopped {n} running agent{'' if n == 1 else 's'}; their tasks are ready again")


def run_gridd_check(
    ws: Workspace, flag: str, *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """The installed gridd run with one of its read-only checks (``--check-state``,
    ``--check-config``) for this workspace, in a fresh process: the new code decides, and
    the client side never imports the daemon side. Raises ``OSError`` or
    ``subprocess.TimeoutExpired`` when it cannot be run or does not answer."""
    return subprocess.run(
        [sys.executable, "-m", "gridd.cli.gridd_main", flag, "--workspace", str(ws.root)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def check_config(ws: Workspace, *, doing: str) -> None:
    """Ask the installed ``gridd --check-config`` whether a start would accept the
    workspace's config; raise with its reason when not, before ``doing`` stops anything."""
    try:
        result = run_gridd_check(ws, "--check-config", timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GriddError(
            f"could not check the config before the {doing}: {exc}; nothing was stopped",
            code="config_check_failed",
        ) from None
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or [
            f"gridd --check-config: exit {result.returncode}"
        ]
        reason = lines[-1].removeprefix("gridd: ")
        raise GriddError(
            f"{reason}. Nothing was stopped: fix it, then run the {doing} again",
            code="config_invalid",
            details={"check": lines[-1]},
        )


def run_action(ws: Workspace, action: str, *, agents: bool = False) -> int:
    """Run one of ACTIONS but ``upgrade`` (``gridd.cli.upgrade``, which builds on this module),
    printing what happened. Exit status 3: ``status`` found nothing.
    ``agents`` (``stop --agents``): the running agents are stopped too."""
    if action == "restart":
        check_config(ws, doing="restart")
    if action in ("stop", "restart"):
        _print_stop(ws, agents=agents)
    if action in ("start", "restart"):
        _print_start(ws)
    if action == "status":
        status = probe(ws)
        if status is None:
            print(f"gridd is not running for {ws.root}")
            return 3
        print(
            f"gridd is running for {ws.root}: pid {status.pid}, version {status.version},"
            f" up {duration(status.uptime)}, socket {ws.socket_path}"
        )
        _print_problems(status)
    return 0
