from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemons import DaemonProc, running_daemon, stop_workspace
from tests.support.repos import make_repo, remove_repo


@pytest.fixture
def repo() -> Iterator[Path]:
    """A fresh git repository with one commit, at a path short enough for a socket."""
    root = make_repo()
    yield root
    remove_repo(root)


@pytest.fixture
def logdir() -> Iterator[Path]:
    """A short-pathed scratch directory where scripted agents (tests/agents) log their runs."""
    with tempfile.TemporaryDirectory(prefix="glog") as d:
        yield Path(d)


@pytest.fixture
def daemon(repo: Path) -> Iterator[DaemonProc]:
    """A real gridd serving ``repo``; stopped with SIGTERM afterwards."""
    with running_daemon(repo) as d:
        yield d


@pytest.fixture(scope="module")
def live() -> Iterator[DaemonProc]:
    """One real gridd shared by a module's tests (requests that leave nothing behind)."""
    root = make_repo()
    try:
        with running_daemon(root) as d:
            yield d
    finally:
        remove_repo(root)


@pytest.fixture
def ws(repo: Path) -> Iterator[Path]:
    """A repository whose gridd (started by gridctl during the test) and agents are gone
    afterwards."""
    try:
        yield repo
    finally:
        stop_workspace(repo)


def mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    path.mkdir(mode=0o700, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


@pytest.fixture
def small_disk_repo() -> Iterator[Path]:
    """A repository whose ``.grid`` is a 24 MiB tmpfs, to fill or make read-only (root
    only; skipped otherwise)."""
    root = make_repo()
    grid = root / ".grid"
    if not mount_tmpfs(grid, "24m"):
        remove_repo(root)
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield root
    finally:
        # Everything mounted there (a test's read-only bind mount left busy, then the tmpfs).
        while os.path.ismount(grid):
            if subprocess.run(["umount", "-l", str(grid)], check=False).returncode != 0:
                break
        remove_repo(root)
