"""Download throughput through a sandboxed run's filtering proxy against a direct download.

Three processes on loopback: a server answering any request with a 50 MB body (10 MB with
``--quick``) from memory; gridd's proxy (``runs/egress.py``'s ``EgressProxies``, in a
process of its own with its own event loop, as in the daemon) allowing that server; and
``curl`` downloading to ``/dev/null``, straight to the server (the baseline) or through the
proxy with ``CONNECT`` (``curl -p -x``: what an agent's HTTPS does). Downloads alternate
between the two, one at a time; the time is curl's own ``time_total``.

Baseline: the direct downloads. Target: the proxy's median throughput >= 0.8 x the direct
median. Skipped (no figures) without ``curl``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import PYTHON, ROOT, Check, latency_baseline, median, ms_summary, result

NAME = "egress"
RUNS = 9
RUNS_QUICK = 4
SIZE_MB = 50
SIZE_MB_QUICK = 10
TARGET_RATIO = 0.8

SERVER = """
import socket, sys, threading
size = int(sys.argv[1])
body = b"x" * size
head = b"HTTP/1.1 200 OK\\r\\ncontent-length: %d\\r\\nconnection: close\\r\\n\\r\\n" % size
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
def serve(conn):
    with conn:
        conn.recv(65536)
        conn.sendall(head)
        conn.sendall(body)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

PROXY = """
import asyncio, sys
from gridd.runs.egress import EgressProxies
async def main():
    proxies = EgressProxies(lambda *denied: None)
    print(await proxies.open("bench", [f"127.0.0.1:{sys.argv[1]}"]), flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@contextmanager
def _serving(code: str, *args: str) -> Iterator[int]:
    """A helper process that prints its port, then serves until it is killed."""
    proc = subprocess.Popen(
        [PYTHON, "-c", code, *args], stdout=subprocess.PIPE, cwd=str(ROOT), text=True
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def _download(curl: str, port: int, proxy: int | None) -> float:
    argv = [curl, "-sS", "-o", "/dev/null", "-w", "%{time_total}"]
    if proxy is not None:
        argv += ["-p", "-x", f"http://127.0.0.1:{proxy}"]
    done = subprocess.run(
        [*argv, f"http://127.0.0.1:{port}/"], capture_output=True, text=True, check=True
    )
    return float(done.stdout)


def run(quick: bool) -> dict[str, Any]:
    runs = RUNS_QUICK if quick else RUNS
    size_mb = SIZE_MB_QUICK if quick else SIZE_MB
    curl = shutil.which("curl")
    if curl is None:
        return result(
            name=NAME,
            title="proxy throughput: skipped, no curl",
            checks=[],
            baseline={},
            ratio=None,
            ratio_label="",
            figures={},
            quick=quick,
        )
    times: dict[str, list[float]] = {"direct": [], "proxy": []}
    with _serving(SERVER, str(size_mb * 1_000_000)) as port, _serving(PROXY, str(port)) as proxy:
        _download(curl, port, None)  # warm-ups
        _download(curl, port, proxy)
        for _ in range(runs):
            times["direct"].append(_download(curl, port, None))
            times["proxy"].append(_download(curl, port, proxy))
    direct_mbs = size_mb / median(times["direct"])
    proxy_mbs = size_mb / median(times["proxy"])
    ratio = proxy_mbs / direct_mbs
    return result(
        name=NAME,
        title=f"{size_mb} MB download through a run's filtering proxy against direct",
        checks=[
            Check(
                metric=f"median throughput through the proxy ({runs} downloads)",
                value=round(proxy_mbs, 1),
                unit="MB/s",
                target=f">= {TARGET_RATIO:g} x direct ({TARGET_RATIO * direct_mbs:.0f} MB/s)",
                passed=ratio >= TARGET_RATIO,
            )
        ],
        baseline=latency_baseline("the same download, straight to the server", times["direct"]),
        ratio=ratio,
        ratio_label="proxy throughput / direct throughput",
        figures={
            "runs": runs,
            "size_mb": size_mb,
            "direct_mb_per_s": round(direct_mbs, 1),
            "proxy_ms": ms_summary(times["proxy"]),
        },
        quick=quick,
        summary=f"through the proxy {proxy_mbs:.0f} MB/s, direct {direct_mbs:.0f} MB/s;"
        f" ratio {ratio:.2f}",
        notes="downloads alternate, one at a time, after one warm-up of each; curl's"
        " time_total, CONNECT through the proxy",
    )
