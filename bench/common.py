"""Shared machinery for the benchmarks: result records, throwaway repositories, a real
``gridd`` process, a raw keep-alive HTTP client over a Unix socket, and statistics.

Everything here is deliberately cheap on the client side: on a 2-core machine the client
competes with the server for CPU, so it must cost as little as possible per request.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PYTHON = sys.executable
#: The project root (bench/..), so that subprocesses can ``-m bench.<module>``.
ROOT = Path(__file__).resolve().parent.parent


# -- results ------------------------------------------------------------------------------------


@dataclass
class Check:
    """One figure compared with its target."""

    metric: str
    value: float
    unit: str
    target: str  # human-readable, e.g. "<= 0.5 s"
    passed: bool


def result(
    *,
    name: str,
    title: str,
    checks: Sequence[Check],
    baseline: dict[str, Any],
    ratio: float | None,
    ratio_label: str,
    figures: dict[str, Any],
    quick: bool,
    summary: str = "",
    notes: str = "",
) -> dict[str, Any]:
    """The one shape every ``run()`` returns (and ``__main__`` prints and saves)."""
    return {
        "name": name,
        "title": title,
        "quick": quick,
        "passed": all(c.passed for c in checks),
        "checks": [asdict(c) for c in checks],
        "baseline": baseline,
        "ratio": None if ratio is None else round(ratio, 4),
        "ratio_label": ratio_label,
        "figures": figures,
        "summary": summary,  # one line printed under the table: the figures worth a glance
        "notes": notes,
    }


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return float("nan")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def ms_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50, min, p90 and max of timings in seconds, as milliseconds (2 decimals)."""
    return {
        "p50": round(median(seconds) * 1000, 2),
        "min": round(min(seconds) * 1000, 2),
        "p90": round(percentile(seconds, 90) * 1000, 2),
        "max": round(max(seconds) * 1000, 2),
    }


def latency_baseline(what: str, seconds: Sequence[float]) -> dict[str, Any]:
    """The ``baseline`` block of a latency benchmark: what it is, its median and range (ms)."""
    return {
        "what": what,
        "value": round(median(seconds) * 1000, 2),
        "unit": "ms",
        "min_ms": round(min(seconds) * 1000, 2),
        "max_ms": round(max(seconds) * 1000, 2),
    }


# -- workspaces ---------------------------------------------------------------------------------


def make_repo() -> Path:
    """A real git repository with one commit at a short /tmp path (sockets need < 108 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="gb", dir="/tmp"))
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    git = ["git", "-C", str(root), "-c", "user.email=bench@example.com", "-c", "user.name=bench"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True, env=env)
    (root / "README.md").write_text("benchmark repo\n")
    subprocess.run([*git, "add", "README.md"], check=True, env=env)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True, env=env)
    return root


def remove_repo(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def temp_repo() -> Iterator[Path]:
    root = make_repo()
    try:
        yield root
    finally:
        remove_repo(root)


# -- a raw HTTP/1.1 client over a Unix socket ------------------------------------------------


class RawHTTP:
    """A minimal keep-alive HTTP/1.1 client: one connection, Content-Length bodies only.

    Much cheaper per request than httpx, so the server, not the client, is what is measured.
    """

    def __init__(self, path: Path | str, *, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self._buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawHTTP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def request_bytes(method: str, target: str) -> bytes:
        return f"{method} {target} HTTP/1.1\r\nhost: gridd\r\n\r\n".encode()

    def send(self, request: bytes) -> tuple[int, bytes]:
        """Send a prebuilt request; return (status, body)."""
        self.sock.sendall(request)
        buf = self._buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        head = buf[:end]
        status = int(head[9:12])
        length = 0
        lower = head.lower()
        at = lower.find(b"content-length:")
        if at >= 0:
            stop = lower.find(b"\r\n", at)
            length = int(lower[at + 15 : stop if stop >= 0 else None])
        body_start = end + 4
        while len(buf) < body_start + length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection mid-body")
            buf += chunk
        self._buf = buf[body_start + length :]
        return status, buf[body_start : body_start + length]

    def get(self, target: str) -> tuple[int, bytes]:
        return self.send(self.request_bytes("GET", target))


def health_ok(sock_path: Path) -> bool:
    """One fresh connection, one ``GET /health``: True on a 200."""
    try:
        with RawHTTP(sock_path, timeout=1.0) as client:
            status, _ = client.get("/health")
            return status == 200
    except OSError:
        return False


def wait_until(predicate: Any, *, timeout: float, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


# -- a real gridd ---------------------------------------------------------------------------


def gridd_argv(root: Path) -> list[str]:
    """The installed ``gridd`` console script when present (what users run), else ``-m``."""
    script = Path(PYTHON).parent / "gridd"
    if script.exists():
        return [str(script), "--workspace", str(root)]
    return [PYTHON, "-m", "gridd.cli.gridd_main", "--workspace", str(root)]


@dataclass
class Gridd:
    root: Path
    proc: subprocess.Popen[bytes]

    @property
    def sock(self) -> Path:
        return self.root / ".grid" / "gridd.sock"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 10.0) -> float:
        """SIGTERM and wait; returns the seconds it took to exit."""
        started = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.perf_counter() - started


def launch_gridd(root: Path) -> Gridd:
    proc = subprocess.Popen(
        gridd_argv(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(root)
    )
    return Gridd(root=root, proc=proc)


@contextlib.contextmanager
def running_gridd(root: Path, *, timeout: float = 15.0) -> Iterator[Gridd]:
    """A real gridd serving ``root``, answering ``/health`` when the block starts."""
    daemon = launch_gridd(root)
    try:
        ok = wait_until(
            lambda: daemon.proc.poll() is not None or health_ok(daemon.sock),
            timeout=timeout,
            interval=0.02,
        )
        if not ok or daemon.proc.poll() is not None:
            raise RuntimeError(f"gridd did not start for {root} (exit {daemon.proc.returncode})")
        yield daemon
    finally:
        daemon.stop()


# -- the bare baseline server ------------------------------------------------------------------


@contextlib.contextmanager
def running_app(
    module: str, sock_path: Path, *, timeout: float = 15.0
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m <module> <sock_path>``: a baseline server, answering ``/health`` when the
    block starts; afterwards it is stopped and its socket and ``<socket>.*`` files removed."""
    proc = subprocess.Popen(
        [PYTHON, "-m", module, str(sock_path)],
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ok = wait_until(
            lambda: proc.poll() is not None or health_ok(sock_path), timeout=timeout, interval=0.02
        )
        if not ok or proc.poll() is not None:
            raise RuntimeError(f"{module} did not start (exit {proc.returncode})")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for leftover in [sock_path, *sock_path.parent.glob(f"{sock_path.name}.*")]:
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def running_bare_app(
    sock_path: Path, *, timeout: float = 15.0
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """``bench/bare_app.py``: a plain Starlette app on uvicorn over ``sock_path``."""
    return running_app("bench.bare_app", sock_path, timeout=timeout)
