"""The merge train on real repositories and real daemons: approved tasks waiting together
are merged in order into one candidate and gated once; a failing candidate is bisected, the
task that fails alone goes back through the policy and the rest land; a flaky gate blames
nobody; a conflict leaves the batch before any gate; a user's commit mid-train is kept; a
daemon killed during a gate, a bisection or a landing leaves every task merged once or
returned.

The gate (``[merge] check``) is a script each test steers: it logs the task files of every
candidate it sees, fails while a ``bad-*.txt`` file is in the candidate, fails its first run
when told to be flaky, and holds (a crash point) on the run the test names."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.client import GridClient
from gridd.git.train import Bisection, Blame
from tests.support.api import wait_task_status
from tests.support.cli import gridctl
from tests.support.daemons import core_daemon
from tests.support.git import git
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for

GATE = """\
import os, pathlib, sys, time
log = pathlib.Path(sys.argv[1])
files = sorted(f for f in os.listdir(".") if f.endswith(".txt"))
with (log / "gate-runs").open("a") as fh:
    fh.write(" ".join(files) + "\\n")
run = len((log / "gate-runs").read_text().splitlines())
hold = log / f"hold-{run}"
if hold.exists():
    (log / f"held-{run}").touch()
    while hold.exists():
        time.sleep(0.05)
if (log / "flaky").exists():
    (log / "flaky").unlink()
    print("flaky gate: failed once")
    sys.exit(1)
time.sleep(0.2)
bad = [f for f in files if f.startswith("bad-")]
print("bad files:", *bad)
sys.exit(3 if bad else 0)
"""


@pytest.fixture
def logdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gtrain") as d:
        yield Path(d)


def configure(
    root: Path,
    logdir: Path,
    *,
    max_batch: int = 12,
    gate_script: str = GATE,
    merge_extra: dict[str, object] | None = None,
) -> None:
    """The whole config (written again: a restart may change it), the gate in ``logdir``."""
    write_core_config(
        root,
        agents={"edit": {"command": agent_command("editor.py", str(logdir), "{prompt}")}},
        scheduler={"default_agent": "edit"},
    )
    gate = logdir / "gate.py"
    gate.write_text(gate_script)
    merge = {
        "check": [sys.executable, str(gate), str(logdir)],
        "check_timeout_seconds": 60,
        "max_batch": max_batch,
        "batch_wait_seconds": 3,
        **(merge_extra or {}),
    }
    lines = ["", "[merge]", *(f"{k} = {json.dumps(v)}" for k, v in merge.items())]
    with (root / ".grid" / "config.toml").open("a") as fh:
        fh.write("\n".join(lines) + "\n")


def names(n: int) -> list[str]:
    return [f"t{i:02d}" for i in range(1, n + 1)]


def plan(
    ids: list[str],
    *,
    bad: frozenset[str] | set[str] = frozenset(),
    extra: dict[str, dict[str, str]] | None = None,
) -> list[dict[str, object]]:
    tasks = []
    for task_id in ids:
        write = {f"{task_id}.txt": f"from {task_id}\n"}
        if task_id in bad:
            write[f"bad-{task_id}.txt"] = "breaks the gate\n"
        write.update((extra or {}).get(task_id, {}))
        tasks.append(
            {"id": task_id, "title": f"task {task_id}", "prompt": json.dumps({"write": write})}
        )
    return tasks


def start_and_approve(c: GridClient, tasks: list[dict[str, object]], branch: str) -> None:
    """All tasks to review, then approved together (one train)."""
    c.post("/plans", {"tasks": tasks})
    c.post("/session/start", {"featureBranch": branch, "maxAgents": 6, "onConflict": "fail"})
    for t in tasks:
        wait_task_status(c, str(t["id"]), "review", timeout=60)
    for t in tasks:
        c.post(f"/tasks/{t['id']}/approve")


def gate_runs(logdir: Path) -> list[list[str]]:
    path = logdir / "gate-runs"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def settled(c: GridClient, ids: list[str], *, timeout: float = 60) -> dict[str, dict[str, object]]:
    def check() -> dict[str, dict[str, object]] | None:
        tasks = {t: c.get(f"/tasks/{t}") for t in ids}
        return (
            tasks if all(t["status"] not in ("merging", "review") for t in tasks.values()) else None
        )

    found: dict[str, dict[str, object]] = wait_for(check, timeout=timeout, message="the train")
    return found


def assert_merged_once_each(repo: Path, branch: str, ids: list[str]) -> None:
    """Every task's own merge commit, with its trailer, exactly once on the branch."""
    trailers = git(repo, "log", "--format=%(trailers:key=Grid-Task,valueonly)", branch).split()
    assert sorted(trailers) == sorted(ids)


# -- batches ----------------------------------------------------------------------------------


def test_twelve_good_tasks_land_after_one_gate_run_each_with_its_own_merge_commit(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    ids = names(12)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_and_approve(c, plan(ids), "feature/train")
        tasks = settled(c, ids)
        assert {t["status"] for t in tasks.values()} == {"done"}
        assert len(gate_runs(logdir)) == 1
        assert set(gate_runs(logdir)[0]) >= {f"{t}.txt" for t in ids}
        head = git(repo, "rev-parse", "feature/train").strip()
        commits = [str(tasks[t]["mergeCommit"]) for t in ids]
        assert len(set(commits)) == 12 and commits[-1] == head
        for task_id, commit in zip(ids, commits, strict=True):
            trailer = git(repo, "log", "-1", "--format=%(trailers:key=Grid-Task,valueonly)", commit)
            assert trailer.strip() == task_id
        assert_merged_once_each(repo, "feature/train", ids)
        started = [e.data for e in event_log(c, types={"merge.batch_started"})]
        assert len(started) == 1 and started[0]["tasks"] == ids
        passed = [e.data for e in event_log(c, types={"merge.batch_passed"})]
        assert passed == [
            {"batchId": started[0]["batchId"], "tasks": ids, "candidate": head, "retried": False}
        ]
        metrics = c.get_text("/metrics")
        assert "gridd_merge_gate_runs_total 1.0" in metrics
        assert "gridd_merges_total 12.0" in metrics


# -- finding the culprit --------------------------------------------------------------------------


def test_one_bad_task_in_twelve_is_returned_and_eleven_land_within_the_round_bound(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    ids = names(12)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_and_approve(c, plan(ids, bad={"t08"}), "feature/culprit")
        tasks = settled(c, ids)
        assert tasks["t08"]["status"] == "failed"
        assert {t for t, v in tasks.items() if v["status"] == "done"} == set(ids) - {"t08"}
        assert len(gate_runs(logdir)) <= math.ceil(math.log2(12)) + 2
        assert_merged_once_each(repo, "feature/culprit", [t for t in ids if t != "t08"])
        failed = [e.data for e in event_log(c, types={"task.merge_check_failed"})]
        assert [f["taskId"] for f in failed] == ["t08"]
        assert "bad-t08.txt" in str(failed[0]["output"])
        culprits = [e.data.get("culprit") for e in event_log(c, types={"merge.bisected"})]
        assert "t08" in culprits
        # the halves that landed are the failed candidate's own merges, not merged again
        first = event_log(c, types={"merge.batch_failed"})[0].data["candidate"]
        landed = event_log(c, types={"merge.batch_passed"})[0].data["candidate"]
        git(repo, "merge-base", "--is-ancestor", landed, first)


def test_two_bad_tasks_are_both_returned_and_the_rest_land(repo: Path, logdir: Path) -> None:
    configure(repo, logdir)
    ids = names(8)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_and_approve(c, plan(ids, bad={"t02", "t07"}), "feature/two")
        tasks = settled(c, ids)
        assert {t for t, v in tasks.items() if v["status"] == "failed"} == {"t02", "t07"}
        assert_merged_once_each(repo, "feature/two", [t for t in ids if t not in ("t02", "t07")])
        # nothing failing ever landed: the branch passes the gate
        assert not any(
            f.startswith("bad-") for f in git(repo, "ls-tree", "--name-only", "feature/two").split()
        )


def test_a_flaky_gate_blames_nobody_the_last_suspect_passes_its_retry_and_lands(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    ids = names(6)
    (logdir / "flaky").touch()  # the first run fails, whatever the candidate
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_and_approve(c, plan(ids), "feature/flaky")
        tasks = settled(c, ids)
        assert {t["status"] for t in tasks.values()} == {"done"}
        assert_merged_once_each(repo, "feature/flaky", ids)
        assert len(gate_runs(logdir)) <= math.ceil(math.log2(6)) + 2
        passed = [e.data for e in event_log(c, types={"merge.batch_passed"})]
        assert [p["tasks"] for p in passed if p["retried"]] == [["t06"]]
        assert not event_log(c, types={"task.merge_check_failed"})
        assert all(e.data["culprit"] is None for e in event_log(c, types={"merge.bisected"}))


def test_a_textual_conflict_in_a_batch_leaves_it_before_any_gate_and_the_rest_land(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    ids = names(5)
    clash = {"t02": {"shared.txt": "from t02\n"}, "t04": {"shared.txt": "from t04\n"}}
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_and_approve(c, plan(ids, extra=clash), "feature/clash")
        tasks = settled(c, ids)
        assert tasks["t04"]["status"] == "failed"
        assert tasks["t04"]["mergeConflict"] == ["shared.txt"]
        assert_merged_once_each(repo, "feature/clash", ["t01", "t02", "t03", "t05"])
        runs = gate_runs(logdir)
        assert len(runs) == 1 and "t04.txt" not in runs[0]
        conflicts = [e.data for e in event_log(c, types={"task.merge_conflict"})]
        head = git(repo, "rev-parse", "feature/clash").strip()
        assert conflicts == [{"taskId": "t04", "files": ["shared.txt"], "featureCommit": head}]


def test_a_user_commit_on_the_feature_branch_mid_train_is_kept(repo: Path, logdir: Path) -> None:
    configure(repo, logdir)
    ids = names(4)
    (logdir / "hold-1").touch()
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_and_approve(c, plan(ids), "feature/user")
        wait_for((logdir / "held-1").exists, timeout=30, message="the first gate")
        user = user_commit(repo, "feature/user")
        (logdir / "hold-1").unlink()
        tasks = settled(c, ids)
        assert {t["status"] for t in tasks.values()} == {"done"}
        git(repo, "merge-base", "--is-ancestor", user, "feature/user")
        assert_merged_once_each(repo, "feature/user", ids)
        assert len(gate_runs(logdir)) == 2  # the candidate was built again on top, and gated
        assert "user.txt" in gate_runs(logdir)[1]


def test_state_and_gridctl_status_show_which_tasks_ride_in_the_candidate(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    ids = names(3)
    (logdir / "hold-1").touch()
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_and_approve(c, plan(ids), "feature/shown")
        wait_for((logdir / "held-1").exists, timeout=30, message="the first gate")
        train = c.get("/state")["mergeTrain"]
        started = event_log(c, types={"merge.batch_started"})[0].data
        assert train["batchId"] == started["batchId"]
        assert train["phase"] == "gating" and train["tasks"] == ids
        assert train["candidate"] == started["candidate"] and train["gateStartedAt"]
        shown = gridctl(repo, "--no-start", "status").stdout
        assert "merge train: 3 task(s) ride (gating for" in shown
        assert "t01, t02, t03" in shown
        (logdir / "hold-1").unlink()
        settled(c, ids)
        assert c.get("/state")["mergeTrain"] is None
        assert "merge train" not in gridctl(repo, "--no-start", "status").stdout


def user_commit(repo: Path, branch: str) -> str:
    tip = git(repo, "rev-parse", branch).strip()
    blob = subprocess.run(
        ["git", "-C", str(repo), "hash-object", "-w", "--stdin"],
        input="mine\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree = subprocess.run(
        ["git", "-C", str(repo), "mktree"],
        input=git(repo, "ls-tree", tip) + f"100644 blob {blob}\tuser.txt\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    user = git(repo, "commit-tree", tree, "-p", tip, "-m", "the user's own commit").strip()
    git(repo, "update-ref", f"refs/heads/{branch}", user, tip)
    return user


# -- kill -9 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("hold_run", "bad"), [(1, set()), (3, {"t03"})], ids=["gate", "bisection"])
def test_a_daemon_killed_during_a_gate_or_a_bisection_merges_every_task_once_or_returns_it(
    repo: Path, logdir: Path, hold_run: int, bad: set[str]
) -> None:
    configure(repo, logdir)
    ids = names(6)
    (logdir / f"hold-{hold_run}").touch()
    try:
        with core_daemon(repo) as daemon:
            c = daemon.client()
            start_and_approve(c, plan(ids, bad=bad), "feature/k9")
            wait_for((logdir / f"held-{hold_run}").exists, timeout=40, message="the held gate")
            assert {c.get(f"/tasks/{t}")["status"] for t in ids} == {"merging"}
            daemon.kill9()
    finally:
        (logdir / f"hold-{hold_run}").unlink()
    with core_daemon(repo) as daemon:
        c = daemon.client()
        tasks = settled(c, ids)
        assert {t for t, v in tasks.items() if v["status"] == "failed"} == bad
        assert_merged_once_each(repo, "feature/k9", [t for t in ids if t not in bad])


def test_a_daemon_killed_between_the_batch_merge_and_the_ref_update_merges_every_task_once(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir)
    ids = names(5)
    pause = repo.parent / (repo.name + ".pause")
    try:
        with core_daemon(repo, env={"GRIDD_TEST_MERGE_PAUSE": str(pause)}) as daemon:
            c = daemon.client()
            pause.touch()
            start_and_approve(c, plan(ids), "feature/k9land")
            before = git(repo, "rev-parse", "feature/k9land").strip()
            wait_for(pause.with_name(pause.name + ".reached").exists, timeout=40)
            recorded = [c.get(f"/tasks/{t}") for t in ids]
            assert all(t["status"] == "merging" and t["mergeCommit"] for t in recorded)
            daemon.kill9()
        assert git(repo, "rev-parse", "feature/k9land").strip() == before
        with core_daemon(repo) as daemon:
            c = daemon.client()
            tasks = settled(c, ids)
            assert {t["status"] for t in tasks.values()} == {"done"}
            assert_merged_once_each(repo, "feature/k9land", ids)
    finally:
        for leftover in pause.parent.glob(pause.name + "*"):
            leftover.unlink(missing_ok=True)


# -- the decision, without processes ------------------------------------------------------------


def gate_rounds(n: int, bad: set[str]) -> tuple[int, list[str], list[str]]:
    """Run the train's decision against a gate that fails any part holding a bad task, the
    tasks sent back riding in the next batch: (gate runs, landed, blamed)."""
    queue, landed, blamed, runs = [f"t{i}" for i in range(n)], [], [], 0
    while queue:
        bisection = Bisection(queue)
        queue = []
        while (step := bisection.next()) is not None:
            if isinstance(step, Blame):
                blamed.append(step.task)
                bisection.blamed()
                continue
            runs += 1
            if bad & set(step.tasks):
                culprit = bisection.failed(step.tasks)
                blamed += [culprit] if culprit else []
                queue += bisection.put_back
            else:
                bisection.passed(step.tasks)
                landed += step.tasks
    return runs, landed, blamed


@pytest.mark.parametrize("n", [2, 3, 5, 8, 12, 20])
def test_one_bad_task_anywhere_is_found_within_log2_n_plus_2_gate_runs(n: int) -> None:
    for position in range(n):
        culprit = f"t{position}"
        runs, landed, blamed = gate_rounds(n, {culprit})
        assert blamed == [culprit]
        assert sorted(landed) == sorted(f"t{i}" for i in range(n) if i != position)
        assert runs <= math.ceil(math.log2(n)) + 2, (n, position, runs)


def test_every_bad_task_is_blamed_and_every_good_one_lands() -> None:
    for bad in ({"t0", "t11"}, {"t3", "t4"}, {"t1", "t5", "t9"}):
        _, landed, blamed = gate_rounds(12, bad)
        assert sorted(blamed) == sorted(bad)
        assert sorted(landed) == sorted(f"t{i}" for i in range(12) if f"t{i}" not in bad)
