"""gridd's benchmarks: speed is measured here and never asserted in the test suite.

Run them all with ``make bench`` (``python -m bench``), or a few with
``python -m bench health_rps sse_fanout``; ``--quick`` (or ``BENCH_QUICK=1``) shortens the
long ones. Each benchmark prints PASS/FAIL against its target, but the run exits 0 unless a
benchmark crashed: machines are noisy, and a FAIL is a figure to look at, not a broken build.

Adding a benchmark (the pattern every module here follows):

1. Create ``bench/bench_<name>.py`` whose docstring says what is measured, against which
   baseline, and the target.
2. Give it ``run(quick: bool) -> dict`` that measures the baseline *in the same run* (never a
   number remembered from another machine), then builds its answer with
   ``bench.common.result(...)``: one ``Check`` per target, the baseline, and the ratio.
3. Add ``<name>`` to ``BENCHMARKS`` below. ``__main__`` prints the table and writes
   ``bench/results/<name>.json``.
4. Use ``bench.common`` for the shared pieces: short throwaway git repositories under /tmp,
   a real ``gridd`` process, a cheap raw keep-alive HTTP client over the Unix socket, and
   percentiles. Clean up every process and directory you start, even on failure.
5. Add the figure to the table in docs/performance.md, and the run to bench/HISTORY.md.
"""

from __future__ import annotations

#: Run order; each name is a module ``bench.bench_<name>``.
BENCHMARKS: list[str] = [
    "cold_start",
    "idle",
    "health_rps",
    "sse_fanout",
    "spawn",
    "sandbox",
    "egress",
    "kubernetes",
    "podman",
    "beads",
    "throughput",
    "waves",
    "scale",
    "output",
    "durability",
    "questions",
    "metrics",
    "merge",
    "train",
    "flood",
    "bulk",
    "claude_finish",
    "agent_clis",
]

__all__ = ["BENCHMARKS"]
