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
        wait_for(
            lambda: socket_answers(sock) or proc.poll() is not None,
            timeout=15,
            message="gridd to answer /health",
        )
        if proc.poll() is not None:
            out = (root / ".gridd-test-stderr").read_text()
            raise AssertionError(f"gridd exited with {proc.returncode}: {out}")
    return daemon


@contextmanager
def running_daemon(root: Path, **kwargs) -> Iterator[DaemonProc]:  # type: ignore[no-untyped-def]
    daemon = start_daemon(root, **kwargs)
    try:
        yield daemon
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
