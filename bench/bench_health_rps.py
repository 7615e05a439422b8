"""Request rate: ``GET /health`` over the Unix socket on one keep-alive connection.

The client is ``bench.common.RawHTTP`` (prebuilt request bytes, one ``sendall`` and a
Content-Length read per request) so the client costs little next to the server. It runs
against a real ``gridd`` process and, in the same run, against the bare Starlette app of
``bench/bare_app.py`` served with the same uvicorn settings. Rounds alternate between the two
servers (3 rounds of 3 s each; 2 of 1.5 s with ``--quick``) after a warm-up, and each
server's rate is the median of its rounds, which evens out a noisy machine.

Target (issue 14): gridd within 10 % of the bare app's requests/s (ratio >= 0.9).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.common import (
    Check,
    RawHTTP,
    median,
    percentile,
    result,
    running_bare_app,
    running_gridd,
    temp_repo,
)

NAME = "health_rps"
TARGET_RATIO = 0.9
WARMUP_S = 0.5


def _hammer(sock_path: Path, seconds: float) -> tuple[float, list[float]]:
    """Requests/s over ``seconds`` on one connection, and each request's latency."""
    request = RawHTTP.request_bytes("GET", "/health")
    latencies: list[float] = []
    with RawHTTP(sock_path) as client:
        clock = time.perf_counter
        started = clock()
        deadline = started + seconds
        now = started
        while now < deadline:
            status, _ = client.send(request)
            if status != 200:
                raise RuntimeError(f"GET /health answered {status}")
            after = clock()
            latencies.append(after - now)
            now = after
        elapsed = now - started
    return len(latencies) / elapsed, latencies


def run(quick: bool) -> dict[str, Any]:
    rounds, seconds = (2, 1.5) if quick else (3, 3.0)
    rates: dict[str, list[float]] = {"gridd": [], "bare": []}
    latencies: dict[str, list[float]] = {"gridd": [], "bare": []}
    with (
        temp_repo() as repo,
        running_gridd(repo) as daemon,
        running_bare_app(repo.parent / f"{repo.name}-bare.sock") as _bare,
    ):
        socks = {"gridd": daemon.sock, "bare": repo.parent / f"{repo.name}-bare.sock"}
        for sock in socks.values():
            _hammer(sock, WARMUP_S)
        for _ in range(rounds):
            for name, sock in socks.items():
                rate, lat = _hammer(sock, seconds)
                rates[name].append(rate)
                latencies[name].extend(lat)
    gridd_rps, bare_rps = median(rates["gridd"]), median(rates["bare"])
    ratio = gridd_rps / bare_rps

    def ms(values: list[float], p: float) -> float:
        return round(percentile(values, p) * 1000, 3)

    return result(
        name=NAME,
        title="GET /health requests/s (keep-alive)",
        checks=[
            Check(
                metric="gridd / bare app requests/s",
                value=round(ratio, 3),
                unit="x",
                target=f">= {TARGET_RATIO}",
                passed=ratio >= TARGET_RATIO,
            )
        ],
        baseline={
            "what": "bare Starlette app on uvicorn over a Unix socket (bench/bare_app.py)",
            "value": round(bare_rps, 1),
            "unit": "req/s",
        },
        ratio=ratio,
        ratio_label="gridd req/s / bare app req/s",
        figures={
            "gridd_rps": round(gridd_rps, 1),
            "bare_rps": round(bare_rps, 1),
            "rounds": rounds,
            "round_seconds": seconds,
            "gridd_rps_rounds": [round(r, 1) for r in rates["gridd"]],
            "bare_rps_rounds": [round(r, 1) for r in rates["bare"]],
            "gridd_latency_ms": {
                "p50": ms(latencies["gridd"], 50),
                "p99": ms(latencies["gridd"], 99),
            },
            "bare_latency_ms": {"p50": ms(latencies["bare"], 50), "p99": ms(latencies["bare"], 99)},
        },
        quick=quick,
        summary=f"gridd {gridd_rps:,.0f} req/s (p99 {ms(latencies['gridd'], 99)} ms),"
        f" bare {bare_rps:,.0f} req/s (p99 {ms(latencies['bare'], 99)} ms)",
    )
