from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DaemonProc, make_repo, remove_repo, running_daemon, stop_workspace


@pytest.fixture
def repo() -> Iterator[Path]:
    """A fresh git repository with one commit, at a path short enough for a socket."""
    root = make_repo()
    yield root
    remove_repo(root)


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
