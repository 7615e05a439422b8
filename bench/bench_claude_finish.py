"""A claude run's end: the CLI's final ``result`` line -> the task in ``review``.

Claude Code (``--input-format stream-json``) prints its ``result`` and then waits for the
next message; gridd sees the result, closes the agent's stdin, the CLI exits, and the run is
finished (its work committed, the task ``review``, ``agent.completed`` published). A real
daemon runs the stream-json fake (``tests/fakes/claude``, which behaves the same way and
stamps the wall-clock moment it printed its result in ``$FAKE_CLAUDE_RESULT_AT``) for N
tasks (12; 5 with ``--quick``), one at a time; the clock stops when a raw ``GET /events``
reader sees that task's ``agent.completed``.

Baseline (same run): the same fake run directly with pipes by this process, which closes
its stdin on the ``result`` line, waits for it to exit, then ``git add -A`` + ``git commit``
in a worktree: the least any supervisor must do. Target: gridd's median <= 0.5 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.baselines import GIT_IDENTITY, git_env
from bench.common import Check, RawHTTP, make_repo, median, remove_repo, result
from bench.harness import EventTap, agent_daemon, api, request
from gridd.settings import CLAUDE_STREAM_ARGS

NAME = "claude_finish"
RUNS = 12
RUNS_QUICK = 5
TARGET_SECONDS = 0.5
FAKE = Path(__file__).resolve().parent.parent / "tests" / "fakes" / "claude"
ARGV = [sys.executable, str(FAKE), *CLAUDE_STREAM_ARGS]


def _gridd_runs(runs: int, stamps: Path) -> list[float]:
    profile = {
        "command": ["/usr/bin/env", f"FAKE_CLAUDE_RESULT_AT={stamps}", *ARGV],
        "adapter": "claude",
        "stdin": "pipe",
    }
    wall: list[float] = []

    def on_event(_arrived: float, event: Any) -> None:
        tap.events.put((time.time(), event))

    with (
        agent_daemon({"fake": profile}, default_agent="fake") as daemon,
        EventTap(daemon.sock, types=["agent.completed"]) as tap,
        RawHTTP(daemon.sock) as http,
    ):
        tap.on_event = on_event
        api(http, "POST", "/session/start", {"featureBranch": "feature/bench"})
        for n in range(runs):
            task = f"fin{n}"
            api(http, "POST", "/tasks", {"id": task, "title": task, "prompt": "bench"})
            # A running session may have started it already (409 task_working): fine.
            request(http, "POST", f"/tasks/{task}/start")
            arrived, _ = tap.expect(lambda e, t=task: e.data.get("taskId") == t, timeout=60)
            printed = float(stamps.read_text().split()[-1])
            wall.append(arrived - printed)
    return wall


def _baseline_runs(runs: int) -> list[float]:
    root = make_repo()
    out: list[float] = []
    try:
        env = git_env()
        for n in range(runs):
            tree = root.parent / f"{root.name}-wt{n}"
            subprocess.run(
                ["git", "-C", str(root), "worktree", "add", "-q", "-b", f"b{n}", "--", str(tree)],
                check=True,
                env=env,
            )
            proc = subprocess.Popen(
                ARGV,
                cwd=tree,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, "FAKE_CLAUDE_SCENARIO": "simple"},
                text=True,
            )
            assert proc.stdin is not None and proc.stdout is not None
            prompt = {"type": "user", "message": {"role": "user", "content": "bench"}}
            proc.stdin.write(json.dumps(prompt) + "\n")
            proc.stdin.flush()
            for line in proc.stdout:
                if json.loads(line).get("type") == "result":
                    started = time.monotonic()
                    proc.stdin.close()
                    break
            proc.wait()
            subprocess.run(["git", "-C", str(tree), "add", "-A"], check=True, env=env)
            subprocess.run(
                ["git", *GIT_IDENTITY, "-C", str(tree), "commit", "-q", "-m", "bench"],
                check=True,
                env=env,
            )
            out.append(time.monotonic() - started)
    finally:
        remove_repo(root)
        for extra in root.parent.glob(f"{root.name}-wt*"):
            subprocess.run(["rm", "-rf", str(extra)], check=False)
    return out


def run(quick: bool) -> dict[str, Any]:
    runs = RUNS_QUICK if quick else RUNS
    with tempfile.TemporaryDirectory(prefix="gridd-bench-") as tmp:
        wall = _gridd_runs(runs, Path(tmp) / "result-at")
    base = _baseline_runs(runs)
    gridd_median, base_median = median(wall), median(base)
    checks = [
        Check(
            metric="result -> review (median)",
            value=round(gridd_median, 4),
            unit="s",
            target=f"<= {TARGET_SECONDS} s",
            passed=gridd_median <= TARGET_SECONDS,
        )
    ]
    return result(
        name=NAME,
        title="claude: final result -> task in review",
        checks=checks,
        baseline={
            "what": "close stdin, wait for exit, git add + commit (no gridd)",
            "value": round(base_median, 4),
            "unit": "s",
        },
        ratio=gridd_median / base_median if base_median else None,
        ratio_label="gridd / baseline",
        figures={
            "runs": runs,
            "gridd_s": [round(v, 4) for v in wall],
            "baseline_s": [round(v, 4) for v in base],
            "gridd_min_s": round(min(wall), 4),
            "gridd_max_s": round(max(wall), 4),
        },
        quick=quick,
        summary=f"median {gridd_median * 1000:.0f} ms (min {min(wall) * 1000:.0f},"
        f" max {max(wall) * 1000:.0f}); baseline {base_median * 1000:.0f} ms",
    )
