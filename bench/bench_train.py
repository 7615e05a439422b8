"""The merge train: approved work integrated at the speed of one gate run, not one per task.

20 tasks (the trivial agent writes one file each, its own) run to review on a feature
branch; then all 20 are approved at once, and a 2 s gate (``[merge] check = sh -c "sleep 2;
test ! -e BAD.txt"``) runs on every candidate. The clock runs from the first approval to
the last task settled (``task.merged``, or ``task.merge_check_failed`` for the bad one), as
a raw SSE reader sees them. Baseline, same run: today's one-at-a-time queue
(``max_batch = 1``), the same 20 tasks and gate.

1. **All good**, ``max_batch = 20``, one gate at a time, then with ``gate_concurrency = 4``
   (four candidates of five, each on the one ahead, gated side by side). Target: <= 2
   gate-times plus the merges' own cost (20 x the per-merge cost of the plain git script of
   ``bench_merge``, measured in this run).
2. **One bad** (the 8th task's file fails the gate), ``max_batch = 20``: the bad task
   identified (returned, the other 19 merged). With ``gate_concurrency = 4`` (the target):
   <= 6 gate-times. One gate at a time (reported beside it): at most ``ceil(log2 20) + 2``
   = 7 gate runs, and 6 gate-times at the least (the first run and ``ceil(log2 20)`` = 5
   halvings in series), which is why the target needs gates side by side.

Also reported: the train's merge cost per task (its time less its gate runs' time, per task)
against the plain script's per-merge time, and how many gates ran side by side at most.
"""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

from bench.baselines import merge_script_seconds
from bench.common import Check, RawHTTP, make_repo, remove_repo, result, running_gridd
from bench.harness import TRIVIAL_AGENT, EventTap, api, kill_agents, stop_session, write_config
from gridd.client import SSEEvent

NAME = "train"
TASKS = 20
GATE_S = 2.0
BAD = "t7"
SLOTS = 4  # [merge] gate_concurrency of the speculating runs
TIMEOUT_S = 300.0
FEATURE = "feature/train"


class _Settled:
    """Counts tasks settled after approval, and gate runs."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.reviewed = 0
        self.settled = 0
        self.gates = 0
        self.running = 0  # gates started and not yet settled (passed, failed, discarded)
        self.side_by_side = 0
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
            self.running += 1
            self.side_by_side = max(self.side_by_side, self.running)
        elif event.type in ("merge.batch_passed", "merge.batch_failed", "merge.batch_discarded"):
            self.running -= 1
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


def _train(*, max_batch: int, bad: str | None, slots: int = 1) -> dict[str, Any]:
    """Seconds from the first of 20 approvals to the last task settled, and gate runs."""
    tally = _Settled(TASKS)
    root = make_repo()
    try:
        write_config(root, agents={"trivial": {"command": TRIVIAL_AGENT}}, default_agent="trivial")
        check = ["sh", "-c", f"sleep {GATE_S:g}; test ! -e {bad or 'nobody'}.txt"]
        merge = {
            "check": check,
            "max_batch": max_batch,
            "gate_concurrency": slots,
            "batch_wait_seconds": 1.0,
        }
        with (root / ".grid" / "config.toml").open("a") as fh:
            fh.write("\n[merge]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in merge.items()))
        types = [
            "agent.completed",
            "merge.batch_started",
            "merge.batch_passed",
            "merge.batch_failed",
            "merge.batch_discarded",
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
        "gates_side_by_side": tally.side_by_side,
        "returned": tally.returned,
        # Gates side by side overlap: their time is not a sum, so no per-task cost then.
        "merge_cost_per_task_s": max(0.0, elapsed - gates * GATE_S) / TASKS if slots == 1 else None,
    }


def run(quick: bool) -> dict[str, Any]:
    script = merge_script_seconds(TASKS)  # the plain git script's seconds per merge
    queue = _train(max_batch=1, bad=None)
    good = _train(max_batch=TASKS, bad=None)
    one_bad = _train(max_batch=TASKS, bad=BAD)
    spec_good = _train(max_batch=TASKS, bad=None, slots=SLOTS)
    spec_bad = _train(max_batch=TASKS, bad=BAD, slots=SLOTS)
    good_target = 2 * GATE_S + TASKS * script
    bad_target = 6 * GATE_S

    def ratio(case: dict[str, Any]) -> float | None:
        return round(queue["seconds"] / case["seconds"], 2) if case["seconds"] else None

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
                metric=f"{TASKS} good, {SLOTS} gates at once, approval to all merged",
                value=spec_good["seconds"],
                unit="s",
                target=f"<= 2 gate-times + {TASKS} plain merges ({good_target:.1f} s)",
                passed=bool(spec_good["finished"]) and spec_good["seconds"] <= good_target,
            ),
            Check(
                metric=f"{TASKS} with one bad, {SLOTS} gates at once, approval to all settled",
                value=spec_bad["seconds"],
                unit="s",
                target=f"<= 6 gate-times ({bad_target:g} s), the bad one returned",
                passed=bool(spec_bad["finished"])
                and spec_bad["returned"] == [BAD]
                and spec_bad["seconds"] <= bad_target,
            ),
            Check(
                metric=f"{TASKS} with one bad, one gate at a time, gate runs",
                value=one_bad["gate_runs"],
                unit="runs",
                target=f"<= ceil(log2 {TASKS}) + 2 ({math.ceil(math.log2(TASKS)) + 2}),"
                " the bad one returned",
                passed=one_bad["gate_runs"] <= math.ceil(math.log2(TASKS)) + 2
                and one_bad["returned"] == [BAD],
            ),
        ],
        baseline={
            "what": "today's queue (max_batch = 1), the same 20 tasks and gate, same run",
            "value": queue["seconds"],
            "unit": "s",
            "gate_runs": queue["gate_runs"],
            "plain_script_per_merge_ms": round(script * 1000, 1),
        },
        ratio=ratio(spec_bad),
        ratio_label=f"one-at-a-time queue time / one-bad time with {SLOTS} gates at once",
        figures={
            "all_good": good,
            "one_bad": one_bad,
            "all_good_speculating": spec_good,
            "one_bad_speculating": spec_bad,
            "one_at_a_time": queue,
            "ratios_vs_one_at_a_time": {
                "all_good": ratio(good),
                "one_bad": ratio(one_bad),
                "all_good_speculating": ratio(spec_good),
                "one_bad_speculating": ratio(spec_bad),
            },
            "train_merge_cost_per_task_ms": round(good["merge_cost_per_task_s"] * 1000, 1),
            "plain_script_per_merge_ms": round(script * 1000, 1),
        },
        quick=quick,
        summary=f"all good {good['seconds']:.1f} s, {spec_good['seconds']:.1f} s with {SLOTS}"
        f" gates at once, vs {queue['seconds']:.1f} s one at a time; one bad"
        f" {one_bad['seconds']:.1f} s ({one_bad['gate_runs']} gate runs) one gate at a time,"
        f" {spec_bad['seconds']:.1f} s ({spec_bad['gate_runs']} gate runs, at most"
        f" {spec_bad['gates_side_by_side']} side by side) with {SLOTS}, returned"
        f" {spec_bad['returned']}",
    )
