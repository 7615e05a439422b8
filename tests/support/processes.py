"""Processes a test looks at from outside: agents of a workspace, gridd daemons, zombies."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil


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


def settled_rss(pid: int, *, seconds: float = 20.0) -> int:
    """The process's RSS in bytes once it has stopped falling (3 s without a drop of 1 MB),
    or its lowest within ``seconds``."""
    proc = psutil.Process(pid)
    lowest = proc.memory_info().rss
    steady_since = time.monotonic()
    deadline = time.monotonic() + seconds
    while time.monotonic() - steady_since < 3 and time.monotonic() < deadline:
        time.sleep(0.25)
        now = proc.memory_info().rss
        if now < lowest - 1024 * 1024:
            steady_since = time.monotonic()
        lowest = min(lowest, now)
    return lowest
