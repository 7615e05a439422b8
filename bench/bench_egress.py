"""Download throughput through a sandboxed run's filtering proxy against a direct download.

Three processes on loopback: a server answering any request with a 50 MB body (10 MB with
``--quick``) from memory; gridd's proxy (``runs/egress.py``'s ``EgressProxies``, in a
process of its own with its own event loop, as in the daemon) allowing that server; and
``curl`` downloading to ``/dev/null``, straight to the server (the baseline) or through the
proxy with ``CONNECT`` (``curl -p -x``: what an agent's HTTPS does). Downloads alternate
between the two, one at a time; the time is curl's own ``time_total``.

Also, without a target: the proxy process's CPU per proxied download, and how much of it
its event loop's thread spent (``/proc``: the process's ``stat``, which counts the relay's
threads gone since, and the main thread's ``schedstat``), and how late a 5 ms timer on
that loop fired at worst during each download, proxied and direct (the loop must stay
responsive while a tunnel is busy: the daemon serves its API on it).

Also without a target, the floor of any relay on this machine: the same downloads through
a bare forwarder (``FORWARDER``: two threads that ``splice`` each way, no ``CONNECT``, no
asyncio, nothing decided), interleaved with the others. A second loopback hop costs what it
costs whoever relays: on a machine whose two cores a direct download already keeps busy
(the server's and curl's CPU), that floor, not the proxy's design, bounds the ratio; the
proxy's own cost is how far it falls below the bare forwarder (``proxy_vs_bare``).

Baseline: the direct downloads. Target: the proxy's median throughput >= 0.8 x the direct
median. Skipped (no figures) without ``curl``.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import PYTHON, ROOT, Check, latency_baseline, median, ms_summary, result

NAME = "egress"
RUNS = 9
RUNS_QUICK = 4
SIZE_MB = 50
SIZE_MB_QUICK = 10
TARGET_RATIO = 0.8
#: The paced figure's link: 1 Gbit/s.
PACED_MB_S = 125

SERVER = """
import socket, sys, threading, time
size = int(sys.argv[1])
rate = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0  # bytes a second; 0: as fast as it goes
body = b"x" * size
head = b"HTTP/1.1 200 OK\\r\\ncontent-length: %d\\r\\nconnection: close\\r\\n\\r\\n" % size
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
def serve(conn):
    with conn:
        conn.recv(65536)
        conn.sendall(head)
        if not rate:
            conn.sendall(body)
            return
        start, view, sent = time.monotonic(), memoryview(body), 0
        while sent < size:
            conn.sendall(view[sent : sent + 1_000_000])
            sent = min(size, sent + 1_000_000)
            time.sleep(max(0.0, start + sent / rate - time.monotonic()))
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

PROXY = """
import asyncio, sys, time
from gridd.runs.egress import EgressProxies
async def main():
    loop = asyncio.get_running_loop()
    proxies = EgressProxies(lambda *denied: None)
    print(await proxies.open("bench", [f"127.0.0.1:{sys.argv[1]}"]), flush=True)
    worst = 0.0
    def report():  # a line in: the worst lag since the last report out
        nonlocal worst
        sys.stdin.readline()
        print(worst, flush=True)
        worst = 0.0
    loop.add_reader(sys.stdin.fileno(), report)
    while True:
        start = time.monotonic()
        await asyncio.sleep(0.005)
        worst = max(worst, time.monotonic() - start - 0.005)
asyncio.run(main())
"""

FORWARDER = """
import fcntl, os, socket, sys, threading
upstream = int(sys.argv[1])
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
def way(src, dst):
    read, write = os.pipe()
    fcntl.fcntl(read, 1031, 1 << 20)  # F_SETPIPE_SZ, as the proxy's relay grows its pipes
    try:
        while n := os.splice(src.fileno(), write, 1 << 20):
            while n:
                n -= os.splice(read, dst.fileno(), n)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
while True:
    client, _ = listener.accept()
    server = socket.create_connection(("127.0.0.1", upstream))
    for src, dst in ((client, server), (server, client)):
        threading.Thread(target=way, args=(src, dst), daemon=True).start()
"""


@contextmanager
def _serving(code: str, *args: str) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """A helper process that prints its port, then serves until it is killed."""
    proc = subprocess.Popen(
        [PYTHON, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=str(ROOT),
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline()), proc
    finally:
        proc.kill()
        proc.wait()


class _Proxy:
    """The proxy's process, looked at from outside: CPU and its loop's worst lag."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.ticks = os.sysconf("SC_CLK_TCK")

    def cpu(self) -> tuple[float, float]:
        """Seconds of CPU so far: the process's (threads gone included), its main thread's."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        main = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/schedstat").read_text()
        return (int(fields[11]) + int(fields[12])) / self.ticks, int(main.split()[0]) / 1e9

    def lag(self) -> float:
        """The loop's worst lag (seconds) since the last time asked."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())


def _children_cpu() -> float:
    """CPU seconds of the children reaped so far (each download's curl, once it is done)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _download(curl: str, port: int, proxy: int | None) -> float:
    """Seconds to download from ``port``, through the proxy at ``proxy`` if one is given."""
    argv = [curl, "-sS", "-o", "/dev/null", "-w", "%{time_total}"]
    if proxy is not None:
        argv += ["-p", "-x", f"http://127.0.0.1:{proxy}"]
    done = subprocess.run(
        [*argv, f"http://127.0.0.1:{port}/"], capture_output=True, text=True, check=True
    )
    return float(done.stdout)


def _paced(curl: str, size_mb: int, runs: int) -> dict[str, float]:
    """The same downloads from a server paced at ``PACED_MB_S`` (a fast link to the internet,
    where an agent's downloads come from): median seconds each way."""
    times: dict[str, list[float]] = {"direct": [], "proxy": []}
    with (
        _serving(SERVER, str(size_mb * 1_000_000), str(PACED_MB_S * 1_000_000)) as (port, _),
        _serving(PROXY, str(port)) as (proxy, _),
    ):
        for _ in range(runs):
            for way, through in (("direct", None), ("proxy", proxy)):
                times[way].append(_download(curl, port, through))
    return {way: median(spent) for way, spent in times.items()}


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
    lags: dict[str, list[float]] = {"direct": [], "proxy": []}
    cpu = [0.0, 0.0]  # the proxy's process and its loop's thread, over the proxied downloads
    #: CPU seconds each way, over all its downloads: the server's and curl's.
    ends = {"direct": [0.0, 0.0], "proxy": [0.0, 0.0]}
    bare: list[float] = []  # through the bare forwarder
    with (
        _serving(SERVER, str(size_mb * 1_000_000)) as (port, server_proc),
        _serving(PROXY, str(port)) as (proxy, proc),
        _serving(FORWARDER, str(port)) as (forwarder, _),
    ):
        watch, server = _Proxy(proc), _Proxy(server_proc)
        _download(curl, port, None)  # warm-ups
        _download(curl, port, proxy)
        _download(curl, forwarder, None)
        for _ in range(runs):
            bare.append(_download(curl, forwarder, None))
            for way, through in (("direct", None), ("proxy", proxy)):
                watch.lag()
                before, served, curled = watch.cpu(), server.cpu()[0], _children_cpu()
                times[way].append(_download(curl, port, through))
                after = watch.cpu()
                ends[way][0] += server.cpu()[0] - served
                ends[way][1] += _children_cpu() - curled
                lags[way].append(watch.lag())
                if through is not None:
                    cpu = [c + a - b for c, a, b in zip(cpu, after, before, strict=True)]
    direct_mbs = size_mb / median(times["direct"])
    proxy_mbs = size_mb / median(times["proxy"])
    ratio = proxy_mbs / direct_mbs
    bare_ratio = median(times["direct"]) / median(bare)
    paced = _paced(curl, size_mb, 3 if quick else 5)
    paced_ratio = paced["direct"] / paced["proxy"]
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
            "proxy_cpu_ms_per_download": round(cpu[0] / runs * 1000, 1),
            "loop_thread_cpu_ms_per_download": round(cpu[1] / runs * 1000, 2),
            "cpu_ms_per_download": {
                way: {
                    "server": round(spent[0] / runs * 1000, 1),
                    "curl": round(spent[1] / runs * 1000, 1),
                    **({"proxy": round(cpu[0] / runs * 1000, 1)} if way == "proxy" else {}),
                }
                for way, spent in ends.items()
            },
            "bare_forwarder_ratio": round(bare_ratio, 3),
            "proxy_vs_bare": round(ratio / bare_ratio, 3),
            "bare_forwarder_ms": ms_summary(bare),
            "paced_link_mb_per_s": PACED_MB_S,
            "paced_ratio": round(paced_ratio, 3),
            "paced_ms": {way: round(spent * 1000, 1) for way, spent in paced.items()},
            "loop_worst_lag_ms": {
                "during_proxied": ms_summary(lags["proxy"]),
                "during_direct": ms_summary(lags["direct"]),
            },
        },
        quick=quick,
        summary=f"through the proxy {proxy_mbs:.0f} MB/s, direct {direct_mbs:.0f} MB/s;"
        f" ratio {ratio:.2f}; the proxy's CPU {cpu[0] / runs * 1000:.1f} ms per download, its"
        f" loop's {cpu[1] / runs * 1000:.2f} ms; loop lag worst {max(lags['proxy']) * 1000:.1f}"
        f" ms proxied, {max(lags['direct']) * 1000:.1f} ms direct; CPU per download (server"
        f" + curl): direct {sum(ends['direct']) / runs * 1000:.1f} ms, proxied"
        f" {sum(ends['proxy']) / runs * 1000:.1f} ms + the proxy's; from a server paced at"
        f" {PACED_MB_S} MB/s (1 Gbit/s), ratio {paced_ratio:.2f}; a bare splice forwarder"
        f" (any relay's floor here) {bare_ratio:.2f} x direct, the proxy"
        f" {ratio / bare_ratio:.2f} x the bare forwarder",
        notes="downloads alternate, one at a time, after one warm-up of each; curl's"
        " time_total, CONNECT through the proxy. The paced figure (no target): the same"
        " downloads from a server sending at a fast internet link's speed, where an agent's"
        " downloads come from. The bare forwarder (no target): the same downloads through"
        " two splice threads that decide nothing, interleaved: what a second loopback hop"
        " costs on this machine whoever relays",
    )
