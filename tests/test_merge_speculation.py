"""Speculation in the merge train (``[merge] gate_concurrency``) on real repositories and
real daemons: the candidates of a train, each built on the one ahead in its own
integration worktree, are gated at the same time; a failure ahead discards and rebuilds
only the candidates behind it; the feature branch moves only forward, by compare-and-swap,
in approval order; a daemon killed mid-speculation lands every task exactly once and
leaves no integration worktree behind.

The gate is a script that records each run (a unique number, the worktree it runs in, the
task files it sees, when it started and ended: its own clock, not the test's), fails while
a ``bad-*.txt`` file is in the candidate, holds while ``hold-<n>`` (or ``hold-all``)
exists, and, told a number in ``barrier``, waits (at most 30 s) until that many runs have
started: runs that are not concurrent then show it in their timestamps."""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gridd.client import GridClient
from gridd.git.train import Bisection, Blame, Gate, cut
from tests import test_merge_train as train
from tests.support.cli import gridctl
from tests.support.daemons import core_daemon
from tests.support.sse import event_log
from tests.support.waits import wait_for
from tests.test_merge_train import (
    assert_merged_once_each,
    git,
    names,
    plan,
    settled,
    start_and_approve,
)

GATE = """\
import json, os, pathlib, sys, time
log = pathlib.Path(sys.argv[1])
run = 1
while True:
    try:
        os.close(os.open(log / f"started-{run}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        break
    except FileExistsError:
        run += 1
files = sorted(f for f in os.listdir(".") if f.endswith(".txt"))
start = time.time()
record = {"run": run, "cwd": os.path.basename(os.getcwd()), "files": files, "start": start,
          "pid": os.getpid()}
(log / f"run-{run}.json").write_text(json.dumps(record))
barrier = log / "barrier"
if barrier.exists():
    want = int(barrier.read_text())
    while len(list(log.glob("started-*"))) < want and time.time() < start + 30:
        time.sleep(0.02)
for hold in (log / f"hold-{run}", log / "hold-all"):
    if hold.exists():
        (log / f"held-{run}").touch()
        while hold.exists():
            time.sleep(0.05)
time.sleep(0.2)
bad = [f for f in files if f.startswith("bad-")]
code = 3 if bad else 0
(log / f"end-{run}.json").write_text(json.dumps({"end": time.time(), "code": code}))
print("bad files:", *bad)
sys.exit(code)
"""


@pytest.fixture
def logdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gspec") as d:
        yield Path(d)


def configure(root: Path, logdir: Path, *, gate_concurrency: int) -> None:
    train.configure(
        root, logdir, gate_script=GATE, merge_extra={"gate_concurrency": gate_concurrency}
    )


def gate_runs(logdir: Path) -> list[dict[str, object]]:
    """Every gate run, by its number: what it saw, where, when it started and ended (an
    end of None: it was stopped)."""
    runs = []
    for path in sorted(logdir.glob("run-*.json"), key=lambda p: int(p.stem.split("-")[1])):
        run = json.loads(path.read_text())
        end = logdir / f"end-{run['run']}.json"
        run.update(json.loads(end.read_text()) if end.exists() else {"end": None, "code": None})
        runs.append(run)
    return runs


def tasks_in(run: dict[str, object]) -> list[str]:
    files = run["files"]
    assert isinstance(files, list)
    return sorted(f.removesuffix(".txt") for f in files if f.startswith("t"))


def landed_in_order(repo: Path, branch: str) -> list[str]:
    """The tasks merged into the branch, oldest first, along its first parents."""
    out = git(
        repo, "log", "--first-parent", "--reverse", "--format=%(trailers:key=Grid-Task)", branch
    )
    return [line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip()]


def moves_of(repo: Path, branch: str) -> list[str]:
    """The commits the branch was moved to, oldest first (its reflog)."""
    out = git(repo, "reflog", "--format=%H", f"refs/heads/{branch}")
    return list(reversed(out.split()))


def assert_only_forward(repo: Path, branch: str) -> None:
    """Every move of the branch kept all it held (the compare-and-swap's promise)."""
    moves = moves_of(repo, branch)
    for old, new in itertools.pairwise(moves):
        git(repo, "merge-base", "--is-ancestor", old, new)


def integration_worktrees(repo: Path) -> list[str]:
    """gridd's integration worktrees, registered or lying in .grid/."""
    listed = git(repo, "worktree", "list", "--porcelain")
    registered = {
        Path(line.removeprefix("worktree ")).name
        for line in listed.splitlines()
        if line.startswith("worktree ") and "/.grid/integration" in line
    }
    on_disk = {p.name for p in (repo / ".grid").iterdir() if p.name.startswith("integration")}
    return sorted(registered | on_disk)


def started(c: GridClient) -> list[dict[str, object]]:
    return [e.data for e in event_log(c, types={"merge.batch_started"})]


# -- candidates gated at once -------------------------------------------------------------------


def test_speculation_gates_three_candidates_at_once_each_built_on_the_one_ahead(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir, gate_concurrency=3)
    (logdir / "barrier").write_text("3")
    ids = names(6)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_and_approve(c, plan(ids), "feature/spec")
        tasks = settled(c, ids)
        assert {t["status"] for t in tasks.values()} == {"done"}
        runs = gate_runs(logdir)
        assert len(runs) == 3
        # the gates' own clocks: every one started before any one ended
        assert max(float(r["start"]) for r in runs) < min(float(r["end"]) for r in runs)  # type: ignore[arg-type]
        # each in its own integration worktree
        assert sorted(str(r["cwd"]) for r in runs) == [
            "integration",
            "integration-2",
            "integration-3",
        ]
        # a chain: each candidate holds the ones ahead of it, two tasks more each time
        seen = sorted((tasks_in(r) for r in runs), key=len)
        assert seen == [ids[:2], ids[:4], ids]
        events = started(c)
        assert [e["position"] for e in events] == [1, 2, 3]
        assert events[0]["ahead"] is None
        assert [e["ahead"] for e in events[1:]] == [e["candidate"] for e in events[:2]]
        assert landed_in_order(repo, "feature/spec") == ids
        assert_only_forward(repo, "feature/spec")
        assert_merged_once_each(repo, "feature/spec", ids)


def test_a_failure_ahead_discards_and_rebuilds_only_the_candidates_behind_it(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir, gate_concurrency=3)
    (logdir / "barrier").write_text("3")
    ids = names(3)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_and_approve(c, plan(ids, bad={"t02"}), "feature/behind")
        tasks = settled(c, ids)
        assert tasks["t02"]["status"] == "failed"
        assert tasks["t01"]["status"] == tasks["t03"]["status"] == "done"
        seen = [tasks_in(r) for r in gate_runs(logdir)]
        first, again = seen[:3], seen[3:]
        assert sorted(first, key=len) == [["t01"], ["t01", "t02"], ["t01", "t02", "t03"]]
        # only the one behind the failure is built again, without it; t01's is never redone
        assert again == [["t01", "t03"]]
        discarded = [e.data for e in event_log(c, types={"merge.batch_discarded"})]
        assert [(d["tasks"], d["position"], d["reason"]) for d in discarded] == [
            (["t03"], 3, "ahead_failed")
        ]
        failed = [e.data for e in event_log(c, types={"merge.batch_failed"})]
        assert [f["tasks"] for f in failed] == [["t02"]]
        # t01 landed as first built: its merge commit is the first candidate's
        assert tasks["t01"]["mergeCommit"] == started(c)[0]["candidate"]
        assert landed_in_order(repo, "feature/behind") == ["t01", "t03"]
        assert_only_forward(repo, "feature/behind")


def test_with_speculation_one_bad_task_is_returned_and_the_rest_land_in_approval_order(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir, gate_concurrency=3)
    (logdir / "barrier").write_text("3")  # the first three start together
    ids = names(9)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_and_approve(c, plan(ids, bad={"t05"}), "feature/order")
        tasks = settled(c, ids)
        assert {t for t, v in tasks.items() if v["status"] == "failed"} == {"t05"}
        good = [t for t in ids if t != "t05"]
        assert landed_in_order(repo, "feature/order") == good
        assert_merged_once_each(repo, "feature/order", good)
        assert_only_forward(repo, "feature/order")
        culprits = [e.data.get("culprit") for e in event_log(c, types={"merge.bisected"})]
        assert "t05" in culprits
        # three candidates of three, the failing middle one's prefixes then gated as a chain
        events = started(c)
        assert [e["tasks"] for e in events[:3]] == [ids[0:3], ids[3:6], ids[6:9]]
        assert [(e["tasks"], e["position"]) for e in events if e["bisecting"]] == [
            (["t04"], 1),
            (["t05"], 2),
        ]
        assert not any(
            f.startswith("bad-")
            for f in git(repo, "ls-tree", "--name-only", "feature/order").split()
        )


# -- kill -9 --------------------------------------------------------------------------------------


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize(("point", "slots_after"), [("gating", 1), ("landing", 3)])
def test_a_daemon_killed_mid_speculation_lands_every_task_exactly_once_and_leaves_no_stray(
    repo: Path, logdir: Path, point: str, slots_after: int
) -> None:
    """``gating``: the first candidate landed, the two behind it gating; ``landing``: the
    first candidate's merges recorded, its landing about to move the branch, the two behind
    it gating. The gates the killed daemon left running (held, in their own sessions) are
    stopped by the next one: when it removes their worktrees (restarted with one gate at a
    time) or before it uses them again (with three)."""
    configure(repo, logdir, gate_concurrency=3)
    (logdir / "barrier").write_text("3")
    ids = names(6)
    pause = repo.parent / (repo.name + ".pause")
    env = {"GRIDD_TEST_MERGE_PAUSE": str(pause)} if point == "landing" else {}
    if point == "landing":
        pause.touch()
    for n in (2, 3):  # every run but the first (the first candidate's: it starts first)
        (logdir / f"hold-{n}").touch()
    try:
        with core_daemon(repo, env=env) as daemon:
            c = daemon.client()
            start_and_approve(c, plan(ids), "feature/k9spec")
            wait_for(lambda: len(list(logdir.glob("held-*"))) == 2, timeout=60, message="held")
            first = tasks_in(gate_runs(logdir)[0])
            if point == "gating":
                wait_for(
                    lambda: all(c.get(f"/tasks/{t}")["status"] == "done" for t in first),
                    timeout=30,
                    message="the first candidate landed",
                )
            else:
                wait_for(pause.with_name(pause.name + ".reached").exists, timeout=60)
                assert all(c.get(f"/tasks/{t}")["mergeCommit"] for t in first)
            assert first == ids[:2]
            assert len(integration_worktrees(repo)) == 3
            daemon.kill9()
        for leftover in pause.parent.glob(pause.name + "*"):
            leftover.unlink()
        left = [int(str(r["pid"])) for r in gate_runs(logdir) if r["end"] is None]
        assert len(left) == 2 and all(alive(pid) for pid in left)  # still held
        configure(repo, logdir, gate_concurrency=slots_after)
        (logdir / "barrier").unlink()
        with core_daemon(repo) as daemon:
            c = daemon.client()
            tasks = settled(c, ids)
            assert {t["status"] for t in tasks.values()} == {"done"}
            assert_merged_once_each(repo, "feature/k9spec", ids)
            assert landed_in_order(repo, "feature/k9spec") == ids
            assert_only_forward(repo, "feature/k9spec")
            assert integration_worktrees(repo) == (
                ["integration"]
                if slots_after == 1
                else ["integration", "integration-2", "integration-3"]
            )
            git(repo, "worktree", "prune", "--dry-run")  # nothing half-made left behind
            wait_for(lambda: not any(alive(pid) for pid in left), timeout=10, message="stopped")
    finally:
        for leftover in [*logdir.glob("hold-*"), *pause.parent.glob(pause.name + "*")]:
            leftover.unlink(missing_ok=True)


# -- the decision, without processes ------------------------------------------------------------


def rounds(n: int, bad: set[str], *, slots: int) -> tuple[int, list[str], list[str]]:
    """Run the train's decision against a gate that fails any candidate holding a bad task,
    the candidates of a step gated side by side (one round), taken in order, those behind a
    failure discarded, the tasks sent back riding in the next train: (rounds, landed in
    order, blamed)."""
    order = [f"t{i}" for i in range(n)]
    queue, landed, blamed, count = list(order), [], [], 0
    while queue:
        bisection = Bisection(sorted(queue, key=order.index), slots=slots)  # approval order
        queue = []
        while (step := bisection.next()) is not None:
            if isinstance(step, Blame):
                blamed.append(step.task)
                bisection.blamed()
                continue
            count += 1
            assert len(step.parts) <= slots
            for part in step.parts:
                if bad & set(part):
                    culprit = bisection.failed(part)
                    blamed += [culprit] if culprit else []
                    queue += bisection.put_back
                    break
                bisection.passed(part)
                landed += part
    return count, landed, blamed


def round_bound(n: int, slots: int) -> int:
    """The first round (the chain), the cuts of the failing part into ``slots + 1``, a retry
    of the last suspect, and the train of the tasks sent back."""
    part = -(-n // slots)
    cuts = 0
    while (slots + 1) ** cuts < part:
        cuts += 1
    return 1 + cuts + 2


@pytest.mark.parametrize("slots", [2, 3, 4])
@pytest.mark.parametrize("n", [2, 3, 5, 8, 12, 20])
def test_with_gates_at_once_one_bad_task_anywhere_is_found_within_the_round_bound(
    n: int, slots: int
) -> None:
    for position in range(n):
        culprit = f"t{position}"
        count, landed, blamed = rounds(n, {culprit}, slots=slots)
        assert blamed == [culprit]
        assert landed == [f"t{i}" for i in range(n) if i != position]  # in order
        assert count <= round_bound(n, slots), (n, slots, position, count)


def test_twenty_tasks_with_one_bad_take_at_most_four_rounds_of_four_gates_at_once() -> None:
    # the benchmark's case: 20 approved at once, one bad, gate_concurrency = 4
    worst = max(rounds(20, {f"t{p}"}, slots=4)[0] for p in range(20))
    assert worst <= 4


def test_with_gates_at_once_every_bad_task_is_blamed_and_every_good_one_lands_in_order() -> None:
    for slots in (2, 3):
        for bad in ({"t0", "t11"}, {"t3", "t4"}, {"t1", "t5", "t9"}):
            _, landed, blamed = rounds(12, bad, slots=slots)
            assert sorted(blamed) == sorted(bad)
            assert landed == [f"t{i}" for i in range(12) if f"t{i}" not in bad]


def test_a_failing_part_is_cut_into_slots_plus_one_and_its_prefixes_gated_as_a_chain() -> None:
    bisection = Bisection([f"t{i}" for i in range(10)], slots=3)
    first = bisection.next()
    assert isinstance(first, Gate)
    assert first.parts == [["t0", "t1", "t2"], ["t3", "t4", "t5"], ["t6", "t7", "t8", "t9"]]
    bisection.passed(first.parts[0])
    assert bisection.failed(first.parts[1]) is None
    assert bisection.put_back == ["t6", "t7", "t8", "t9"]
    step = bisection.next()
    assert isinstance(step, Gate)
    # the three suspects in four parts: singletons; the whole is known to fail, not gated
    assert step.parts == [["t3"], ["t4"]]
    assert cut(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d", "e"]]


def test_state_and_gridctl_status_show_each_candidate_gated_at_once(
    repo: Path, logdir: Path
) -> None:
    configure(repo, logdir, gate_concurrency=2)
    (logdir / "hold-all").touch()
    ids = names(4)
    try:
        with core_daemon(repo) as daemon:
            c = daemon.client()
            start_and_approve(c, plan(ids), "feature/shown2")
            wait_for(lambda: len(list(logdir.glob("held-*"))) == 2, timeout=60, message="held")
            train = c.get("/state")["mergeTrain"]
            assert train["phase"] == "gating" and train["tasks"] == ids
            candidates = train["candidates"]
            assert [(k["position"], k["tasks"]) for k in candidates] == [
                (1, ["t01", "t02"]),
                (2, ["t03", "t04"]),
            ]
            assert candidates[0]["ahead"] is None
            assert candidates[1]["ahead"] == candidates[0]["candidate"]
            assert train["candidate"] == candidates[1]["candidate"]
            shown = gridctl(repo, "--no-start", "status").stdout
            assert "merge train: 4 task(s) ride (gating for" in shown
            assert "2 candidates gated at once" in shown
            assert "t01, t02 | t03, t04" in shown
            (logdir / "hold-all").unlink()
            settled(c, ids)
            assert c.get("/state")["mergeTrain"] is None
    finally:
        (logdir / "hold-all").unlink(missing_ok=True)
