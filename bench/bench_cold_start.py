"""Cold start: from launching ``gridd`` to its socket answering ``GET /health``.

Each of the 10 runs launches the ``gridd`` console script in a fresh git repository (so it
also creates ``.grid/``, the database and its schema: the worst case), polls the socket every
5 ms with a fresh connection, and stops the daemon with SIGTERM.

Baseline (same run): launching ``python -c "import starlette, uvicorn"`` to its exit, the
floor any Starlette/uvicorn daemon pays. Target: median <= 0.3 s, with the bytecode cache
on (``compileall`` of gridd first, as a wheel install does).
Also reported: SIGTERM-to-exit time, and the import time of ``gridd.daemon`` alone.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from bench.common import (
    PYTHON,
    ROOT,
    Check,
    health_ok,
    launch_gridd,
    make_repo,
    median,
    remove_repo,
    result,
)

NAME = "cold_start"
RUNS = 10
TARGET_S = 0.3


def _time_command(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _one_start() -> tuple[float, float]:
    """(launch -> /health 200, SIGTERM -> exit) in seconds, for one fresh workspace."""
    root = make_repo()
    try:
        started = time.perf_counter()
        daemon = launch_gridd(root)
        try:
            while not health_ok(daemon.sock):
                if daemon.proc.poll() is not None:
                    raise RuntimeError(f"gridd exited with {daemon.proc.returncode} at startup")
                if time.perf_counter() - started > 15:
                    raise RuntimeError("gridd did not answer /health within 15 s")
                time.sleep(0.005)
            ready = time.perf_counter() - started
        finally:
            stop = daemon.stop()
        return ready, stop
    finally:
        remove_repo(root)


def run(quick: bool) -> dict[str, Any]:
    # The bytecode cache on, as for an installed package: an editable install under
    # PYTHONDONTWRITEBYTECODE=1 would otherwise compile all of gridd at every start.
    subprocess.run([PYTHON, "-m", "compileall", "-q", str(ROOT / "gridd")], check=True)
    # Warm the page cache once so the first measured run is not an outlier.
    _time_command([PYTHON, "-c", "import gridd.daemon, starlette, uvicorn"])
    baseline = [_time_command([PYTHON, "-c", "import starlette, uvicorn"]) for _ in range(RUNS)]
    imports = [_time_command([PYTHON, "-c", "import gridd.daemon"]) for _ in range(RUNS)]
    starts: list[float] = []
    stops: list[float] = []
    for _ in range(RUNS):
        ready, stop = _one_start()
        starts.append(ready)
        stops.append(stop)
    start_median = median(starts)
    base_median = median(baseline)
    return result(
        name=NAME,
        title="Cold start: launch to /health",
        checks=[
            Check(
                metric="median launch -> /health",
                value=round(start_median, 4),
                unit="s",
                target=f"<= {TARGET_S} s",
                passed=start_median <= TARGET_S,
            )
        ],
        baseline={
            "what": 'python -c "import starlette, uvicorn" (launch to exit), median',
            "value": round(base_median, 4),
            "unit": "s",
        },
        ratio=start_median / base_median,
        ratio_label="gridd start / baseline launch",
        figures={
            "runs": RUNS,
            "start_s": [round(x, 4) for x in starts],
            "start_min_s": round(min(starts), 4),
            "start_max_s": round(max(starts), 4),
            "baseline_s": [round(x, 4) for x in baseline],
            "import_gridd_daemon_median_s": round(median(imports), 4),
            "sigterm_to_exit_median_s": round(median(stops), 4),
            "sigterm_to_exit_max_s": round(max(stops), 4),
        },
        quick=quick,
        summary=f"start median {start_median * 1000:.0f} ms (min {min(starts) * 1000:.0f},"
        f" max {max(starts) * 1000:.0f}); import gridd.daemon {median(imports) * 1000:.0f} ms;"
        f" SIGTERM to exit {median(stops) * 1000:.0f} ms",
        notes="fresh workspace per run (creates .grid/ and the database)",
    )
