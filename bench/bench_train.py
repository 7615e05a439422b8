"""The merge train: approved work integrated at the speed of one gate run, not one per task.

20 tasks (the trivial agent writes one file each, its own) run to review on a feature
branch; then all 20 are approved at once, and a 2 s gate (``[merge] check = sh -c "sleep 2;
test ! -e BAD.txt"``) runs on every candidate. The clock runs from the first approval to
the last task settled (``task.merged``, or ``task.merge_check_failed`` for the bad one), as
a raw SSE reader sees them.

1. **All good**, ``max_batch = 20``. Baseline, same run: today's one-at-a-time queue
   (``max_batch = 1``), the same 20 tasks and gate. Target: <= 2 gate-times plus the merges'
   own cost (20 x the per-merge cost of the plain git script of ``bench_merge``, measured in
   this run).
2. **One bad** (the 8th task's file fails the gate), ``max_batch = 20``: the bad task
   identified (returned, the other 19 merged). Target: <= 6 gate-times; and at most
   ``ceil(log2 20) + 2`` = 7 gate runs. One gate at a time, finding one task in 20 takes
   the first run and ``ceil(log2 20)`` = 5 halvings at the least: 6 gate-times before any
   merge is made, so the time target needs gates run side by side (``gate_concurrency``,
   not built), and is reported as it stands.

Also reported: the train's merge cost per task (its time less its gate runs' time, per task)
against the plain script's per-merge time.
"""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

from bench.bench_merge import _baseline
from bench.bench_spawn import (
    TRIVIAL_AGENT,
    EventTap,
    api,
    kill_agents,
    stop_session,
    write_config,
)
from bench.common import Check, RawHTTP, make_repo, remove_repo, result, running_gridd
from gridd.client import SSEEvent

NAME = "train"
TASKS = 20
GATE_S = 2.0
BAD = "t7"
TIMEOUT_S = 300.0
FEATURE = "feature/train"


class _Settled:
    """Counts tasks settled after approval, and gate runs."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.reviewed = 0
        self.settled = 0
        self.gates = 0
        self.last = 0.0
        self.returned: list[str] = []
        self.trouble: list[dict[str, Any]] = []
        self.in_review = threading.Event()
        self.done = threading.Event()

    def __call__(self, now: float, event: SSEEvent) -> None:
        if event.type == "agent.completed":
            self.reviewed += 1
            if self.reviewed >= self.expect:
                self.in_review.set()
        elif event.type == "merge.batch_started":
            self.gates += 1
        elif event.type in ("task.merged", "task.merge_check_failed"):
            if event.type == "task.merge_check_failed":
                self.returned.append(str(event.data["taskId"]))
            self.settled += 1
            self.last = now
            if self.settled >= self.expect:
                self.done.set()
        else:
            self.trouble.append({"type": event.type, **event.data})
            self.in_review.set()
            self.done.set()


def _train(*, max_batch: int, bad: str | None) -> dict[str, Any]:
    """Seconds from the first of 20 approvals to the last task settled, and gate runs."""
    tally = _Settled(TASKS)
    root = make_repo()
    try:
        write_config(root, agents={"trivial": {"command": TRIVIAL_AGENT}}, default_agent="trivial")
        check = ["sh", "-c", f"sleep {GATE_S:g}; test ! -e {bad or 'nobody'}.txt"]
        merge = {"check": check, "max_batch": max_batch, "batch_wait_seconds": 1.0}
        with (root / ".grid" / "config.toml").open("a") as fh:
            fh.write("\n[merge]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in merge.items()))
        types = [
            "agent.completed",
            "merge.batch_started",
            "task.merged",
            "task.merge_check_failed",
            "agent.failed",
            "task.merge_conflict",
            "task.merge_retry",
        ]
        with (
            running_gridd(root) as daemon,
            RawHTTP(daemon.sock, timeout=60) as http,
            EventTap(daemon.sock, types=types, on_event=tally),
        ):
            plan = [{"id": f"t{i}", "title": f"t{i}"} for i in range(TASKS)]
            api(http, "POST", "/plans", {"tasks": plan})
            session = {"featureBranch": FEATURE, "maxAgents": 8, "onConflict": "fail"}
            api(http, "POST", "/session/start", session)
            if not tally.in_review.wait(TIMEOUT_S) or tally.trouble:
                raise RuntimeError(f"tasks did not reach review: {tally.trouble[:2]}")
            started = time.monotonic()
            for i in range(TASKS):
                api(http, "POST", f"/tasks/t{i}/approve")
            approved = time.monotonic() - started
            finished = tally.done.wait(TIMEOUT_S)
            if tally.trouble:
                raise RuntimeError(f"merge trouble: {tally.trouble[:2]}")
            elapsed = tally.last - started
            stop_session(daemon.sock)
    finally:
        kill_agents(root)
        remove_repo(root)
    gates = tally.gates or (TASKS if max_batch == 1 else 0)  # one at a time: no batch events
    return {
        "finished": finished,
        "seconds": round(elapsed, 3),
        "approve_all_s": round(approved, 3),
        "gate_runs": gates,
        "returned": tally.returned,
        "merge_cost_per_task_s": max(0.0, elapsed - gates * GATE_S) / TASKS,
    }


def run(quick: bool) -> dict[str, Any]:
    script = _baseline(TASKS)  # the plain git script's seconds per merge
    queue = _train(max_batch=1, bad=None)
    good = _train(max_batch=TASKS, bad=None)
    one_bad = _train(max_batch=TASKS, bad=BAD)
    good_target = 2 * GATE_S + TASKS * script
    bad_target = 6 * GATE_S
    ratio = queue["seconds"] / good["seconds"] if good["seconds"] else None
    return result(
        name=NAME,
        title=f"merge train: {TASKS} approved at once, a {GATE_S:g} s gate",
        checks=[
            Check(
                metric=f"{TASKS} good, approval to all merged",
                value=good["seconds"],
                unit="s",
                target=f"<= 2 gate-times + {TASKS} plain merges ({good_target:.1f} s)",
                passed=bool(good["finished"]) and good["seconds"] <= good_target,
            ),
            Check(
                metric=f"{TASKS} with one bad, approval to all settled",
                value=one_bad["seconds"],
                unit="s",
                target=f"<= 6 gate-times ({bad_target:g} s), the bad one returned",
                passed=bool(one_bad["finished"])
                and one_bad["returned"] == [BAD]
                and one_bad["seconds"] <= bad_target,
            ),
            Check(
                metric=f"{TASKS} with one bad, gate runs",
                value=one_bad["gate_runs"],
                unit="runs",
                target=f"<= ceil(log2 {TASKS}) + 2 ({math.ceil(math.log2(TASKS)) + 2})",
                passed=one_bad["gate_runs"] <= math.ceil(math.log2(TASKS)) + 2,
            ),
        ],
        baseline={
            "what": "today's queue (max_batch = 1), the same 20 tasks and gate, same run",
            "value": queue["seconds"],
            "unit": "s",
            "gate_runs": queue["gate_runs"],
            "plain_script_per_merge_ms": round(script * 1000, 1),
        },
        ratio=ratio,
        ratio_label="one-at-a-time queue time / train time (all good)",
        figures={
            "all_good": good,
            "one_bad": one_bad,
            "one_at_a_time": queue,
            "train_merge_cost_per_task_ms": round(good["merge_cost_per_task_s"] * 1000, 1),
            "plain_script_per_merge_ms": round(script * 1000, 1),
        },
        quick=quick,
        summary=f"all good {good['seconds']:.1f} s ({good['gate_runs']} gate run(s)) vs"
        f" {queue['seconds']:.1f} s one at a time; one bad {one_bad['seconds']:.1f} s"
        f" ({one_bad['gate_runs']} gate runs, returned {one_bad['returned']})",
    )
