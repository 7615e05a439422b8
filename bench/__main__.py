"""``python -m bench [--quick] [NAME ...]``: run the benchmarks, print a table, save JSON.

Results go to ``bench/results/<name>.json`` (gitignored), with the machine they ran on.
Exit status is 0 whether targets pass or fail; 1 only when a benchmark crashed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import BENCHMARKS
from bench.common import ROOT

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
            ).stdout.strip()
        except OSError:
            return ""

    commit = git("rev-parse", "--short", "HEAD")
    # Figures describe the code that ran: say when gridd/ differs from the commit.
    dirty = bool(git("status", "--porcelain", "--", "gridd"))
    try:
        from gridd import __version__
    except ImportError:
        __version__ = "?"
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "gridd": __version__,
        "commit": commit,
        "gridd_modified": dirty,
    }


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_table(results: list[dict[str, Any]]) -> None:
    rows = [("benchmark", "metric", "value", "target", "baseline", "ratio", "result")]
    for res in results:
        if "error" in res:
            rows.append((res["name"], "-", "-", "-", "-", "-", "CRASHED"))
            continue
        base = res["baseline"]
        baseline = f"{_fmt(base.get('value'))} {base.get('unit', '')}".strip()
        ratio = "-" if res["ratio"] is None else f"{res['ratio']:.3g}"
        for i, check in enumerate(res["checks"]):
            rows.append(
                (
                    res["name"] if i == 0 else "",
                    check["metric"],
                    f"{_fmt(check['value'])} {check['unit']}".strip(),
                    check["target"],
                    baseline if i == 0 else "",
                    ratio if i == 0 else "",
                    "PASS" if check["passed"] else "FAIL",
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter windows (also BENCH_QUICK=1)")
    parser.add_argument(
        "names", nargs="*", help=f"benchmarks to run (default: all of {BENCHMARKS})"
    )
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get("BENCH_QUICK", "") not in ("", "0")
    names = args.names or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")

    host = machine()
    print(f"gridd benchmarks{' (quick)' if quick else ''}: {host['cpus']} CPUs, {host['platform']}")
    load = os.getloadavg()[0]
    host["loadavg_before"] = round(load, 2)
    if load > 0.5 * (host["cpus"] or 1):
        print(f"  note: load average {load:.1f} before starting; expect noisy figures")
    RESULTS.mkdir(exist_ok=True)
    results: list[dict[str, Any]] = []
    crashed = False
    total_started = time.monotonic()
    for name in names:
        print(f"  running {name} ...", flush=True)
        started = time.monotonic()
        try:
            module = importlib.import_module(f"bench.bench_{name}")
            res: dict[str, Any] = module.run(quick)
        except Exception as exc:
            crashed = True
            traceback.print_exc()
            res = {"name": name, "error": f"{type(exc).__name__}: {exc}", "passed": False}
        res["seconds"] = round(time.monotonic() - started, 2)
        res["date"] = datetime.now(UTC).isoformat(timespec="seconds")
        res["machine"] = host
        res["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        (RESULTS / f"{name}.json").write_text(json.dumps(res, indent=2) + "\n")
        results.append(res)
        status = "CRASHED" if "error" in res else ("PASS" if res["passed"] else "FAIL")
        print(f"  {name}: {status} in {res['seconds']} s", flush=True)
    print()
    print_table(results)
    print()
    for res in results:
        if res.get("summary"):
            print(f"{res['name']}: {res['summary']}")
        elif "error" in res:
            print(f"{res['name']}: {res['error']}")
    print(f"\n{len(results)} benchmark(s) in {time.monotonic() - total_started:.1f} s;")
    print(f"figures in {RESULTS.relative_to(ROOT)}/<name>.json")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
