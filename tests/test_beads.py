"""The beads source against a strict stand-in for ``bd`` (tests/fakes/bd, from bd's source)."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gridd.background import Background
from gridd.events import EventBus
from gridd.settings import BeadsSettings
from gridd.sources.bd import BdResult, is_permanent, run_bd
from gridd.sources.beads import BdError, bead_task_fields, parse_ready
from gridd.sources.beads_mirror import BeadWriter, mirror_writes, retry_delay
from gridd.sources.beads_watch import is_issue_data
from gridd.store import Store
from tests.support.daemons import running_daemon
from tests.support.waits import until, wait_for

FAKE_BD = Path(__file__).parent / "fakes" / "bd"


def bead(bead_id: str, **extra: object) -> dict[str, object]:
    return {
        "id": bead_id,
        "title": f"Bead {bead_id}",
        "description": "do the thing",
        "status": "open",
        "priority": 1,
        "issue_type": "task",
        "labels": [],
        "dependent_count": None,
        "created_at": "2026-11-01T00:00:00Z",
        "updated_at": "2026-11-01T00:00:00Z",
        **extra,
    }


def setup_beads(
    repo: Path,
    issues: list[dict[str, object]],
    mode: str = "ok",
    extra: str = "",
    *,
    poll_seconds: float = 0.2,
) -> None:
    (repo / ".beads").mkdir()
    (repo / ".beads" / "fake-bd.json").write_text(json.dumps({"mode": mode, "issues": issues}))
    (repo / ".grid").mkdir(exist_ok=True)
    (repo / ".grid" / "config.toml").write_text(
        "[beads]\nenabled = true\n"
        f"command = [{json.dumps(sys.executable)}, {json.dumps(str(FAKE_BD))}]\n"
        f"poll_seconds = {poll_seconds}\n" + extra
    )


def edit_bd_db(repo: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change the fake bd's database as bd would: under its lock, so that a bd call running
    at the same moment (a retry) cannot write its older copy back over the change."""
    db_path = repo / ".beads" / "fake-bd.json"
    with (repo / ".beads" / "fake-bd.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        db = json.loads(db_path.read_text())
        change(db)
        tmp = db_path.with_name(db_path.name + ".tmp")
        tmp.write_text(json.dumps(db))
        tmp.replace(db_path)


def bd_issue(repo: Path, bead_id: str) -> dict[str, object]:
    db = json.loads((repo / ".beads" / "fake-bd.json").read_text())
    return next(i for i in db["issues"] if i["id"] == bead_id)


def bd_calls(repo: Path) -> list[list[str]]:
    log = repo / ".beads" / "fake-bd.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_parse_ready_is_lenient_about_drifting_fields() -> None:
    out = json.dumps([bead("a", priority=None, labels=None, extra_new_field=[1]), 42, {"no": "id"}])
    beads, warnings = parse_ready(out)
    assert [b["id"] for b in beads] == ["a"]
    assert len(warnings) == 2
    fields = bead_task_fields(beads[0])
    assert fields["priority"] == 2 and fields["labels"] == []
    assert "do the thing" in fields["prompt"]


def test_parse_ready_rejects_garbage_with_a_clear_error() -> None:
    with pytest.raises(BdError, match="not JSON"):
        parse_ready("<html>")
    assert parse_ready("[]") == ([], [])
    assert parse_ready("null") == ([], [])


def test_beads_are_claimed_as_agents_start_and_a_lost_claim_runs_nothing_to_completion(
    repo: Path,
) -> None:
    setup_beads(repo, [bead("bd-1"), bead("bd-2"), bead("bd-race", race=True)])
    with running_daemon(repo, env={"GRID_EXAMPLE_DELAY": "0"}) as d:
        c = d.client()
        wait_for(lambda: len(c.get("/tasks")) == 3, timeout=20, message="beads imported")
        c.post("/session/start", {"featureBranch": "beads-feature", "maxAgents": 3})

        def settled() -> bool:
            by_id = {t["id"]: t for t in c.get("/tasks")}
            return (
                by_id["bd-1"]["status"] == "review"
                and by_id["bd-2"]["status"] == "review"
                and by_id["bd-race"]["status"] == "cancelled"
            )

        wait_for(settled, timeout=60, message="beads worked and the race lost")
        ends = list(c.events(since=0, types=["agent.completed", "agent.stopped"], read_timeout=1))
        assert sorted(e.data["taskId"] for e in ends if e.type == "agent.completed") == [
            "bd-1",
            "bd-2",
        ]
        # An agent may start while bd-race's claim is in flight; the lost claim stops it
        # and nothing of it is committed.
        stopped = [e.data for e in ends if e.type == "agent.stopped"]
        assert all(s["taskId"] == "bd-race" and not s["committedWork"] for s in stopped)
        calls = bd_calls(repo)
        claims = [
            i
            for call in calls
            if call[:1] == ["update"] and "--claim" in call
            for i in call[1:]
            if not i.startswith("--")
        ]
        assert sorted(claims) == ["bd-1", "bd-2", "bd-race"]
        assert all(call[-2:] == ["--limit", "0"] for call in calls if call[0] == "ready")
        wait_for(
            lambda: "gridd:review" in (bd_issue(repo, "bd-1").get("labels") or []),
            timeout=20,
            message="review mirrored to bd",
        )
        assert bd_issue(repo, "bd-1")["status"] == "in_progress"
        c.post("/tasks/bd-1/approve")
        wait_for(
            lambda: bd_issue(repo, "bd-1")["status"] == "closed", timeout=20, message="bd close"
        )
        assert "gridd:review" not in (bd_issue(repo, "bd-1").get("labels") or [])
        assert str(bd_issue(repo, "bd-1")["close_reason"]).startswith("gridd:")
        # bd-race was claimed by a rival: gridd leaves it alone.
        assert bd_issue(repo, "bd-race")["assignee"] == "rival"
        # the worktree made while the lost claim was in flight is gone, branch and all
        assert not (repo / ".grid" / "worktrees" / "bd-race").exists()
        branches = subprocess.run(
            ["git", "branch", "--list", "grid/bd-race"], cwd=repo, capture_output=True, text=True
        ).stdout
        assert branches.strip() == ""
        race_calls = [call for call in bd_calls(repo) if "bd-race" in call]
        assert len(race_calls) == 1 and "--claim" in race_calls[0]
        # Every write was one stock bd accepts: no error, no retry.
        assert not list(c.events(since=0, types=["beads.error"], read_timeout=1))
        lost = list(c.events(since=0, types=["beads.claim_lost"], read_timeout=1))
        assert [e.data["taskId"] for e in lost] == ["bd-race"]
        c.post("/session/stop")


def test_bd_garbage_output_is_an_event_and_a_retry_not_a_crash(repo: Path) -> None:
    setup_beads(repo, [bead("bd-1")], mode="garbage")
    with running_daemon(repo) as d:
        c = d.client()
        errors = wait_for(
            lambda: list(c.events(since=0, types=["beads.error"], read_timeout=1)),
            timeout=20,
            message="beads.error event",
        )
        assert "not JSON" in errors[0].data["error"]
        assert errors[0].data["retryInSeconds"] > 0
        # bd recovers: the task appears on a later poll, the daemon never went away.
        edit_bd_db(repo, lambda db: db.update(mode="ok"))
        wait_for(lambda: [t["id"] for t in c.get("/tasks")] == ["bd-1"], timeout=30)
        assert d.proc.poll() is None


# -- what gridd writes: only what stock bd accepts ----------------------------------------------

BD_STATUSES = {"open", "in_progress", "blocked", "deferred", "closed", "pinned", "hooked"}


def written_statuses(writes: list[list[str]]) -> set[str]:
    return {w[w.index("--status") + 1] for w in writes if "--status" in w}


def test_review_is_in_progress_with_a_label_unless_a_custom_status_is_configured() -> None:
    plain = BeadsSettings()
    assert mirror_writes("x", "review", previous="working", settings=plain) == [
        ["update", "x", "--status", "in_progress", "--add-label", "gridd:review"]
    ]
    custom = BeadsSettings(review_status="review", review_label="ours:rev")
    assert mirror_writes("x", "review", previous="working", settings=custom) == [
        ["update", "x", "--status", "review"]
    ]
    back = mirror_writes("x", "working", previous="review", settings=plain)
    assert back == [["update", "x", "--status", "in_progress", "--remove-label", "gridd:review"]]


def test_done_closes_with_a_reason_naming_the_merge_commit() -> None:
    writes = mirror_writes(
        "x", "done", previous="merging", settings=BeadsSettings(), merge_commit="abc123"
    )
    assert writes[-1] == ["close", "x", "--reason", "gridd: merged as abc123"]
    assert writes[0] == ["update", "x", "--remove-label", "gridd:review"]
    assert mirror_writes("x", "done", previous="review", settings=BeadsSettings())[-1][-1] == (
        "gridd: done"
    )


def test_failure_reopens_with_a_label_and_a_comment_saying_why() -> None:
    writes = mirror_writes(
        "x", "failed", previous="working", settings=BeadsSettings(), error="exit 3"
    )
    assert writes[0][:5] == ["update", "x", "--status", "open", "--assignee"]
    assert "gridd:failed" in writes[0]
    assert writes[1] == ["comments", "add", "x", "gridd: the task failed: exit 3"]


def test_every_status_gridd_writes_by_default_is_one_stock_bd_accepts() -> None:
    settings = BeadsSettings()
    for status in (
        "ready",
        "working",
        "review",
        "merging",
        "done",
        "failed",
        "blocked",
        "cancelled",
        "rate_limited",
        "pending",
    ):
        for previous in (None, "working", "review", "failed"):
            writes = mirror_writes("x", status, previous=previous, settings=settings, claimed=True)
            assert written_statuses(writes) <= BD_STATUSES, (status, previous, writes)


def test_a_cancelled_bead_is_given_back_only_when_gridd_holds_its_claim() -> None:
    settings = BeadsSettings()
    assert mirror_writes("x", "cancelled", previous="ready", settings=settings) == []
    assert mirror_writes("x", "cancelled", previous="working", settings=settings, claimed=True)


def test_bd_refusals_are_permanent_and_outages_are_not() -> None:
    assert is_permanent('invalid status "review" (built-in: open, in_progress, ...)')
    assert is_permanent("unknown flag: --if-assignee")
    assert is_permanent('Error resolving x: no issue found matching "x"')
    assert not is_permanent("failed to open database: connect: connection refused")
    assert BdResult(1, '{"error": "invalid status \\"x\\"", "schema_version": 1}', "").message == (
        'invalid status "x"'
    )
    assert retry_delay(1, base=0.5) == 0.5 and retry_delay(3, base=0.5) == 2.0
    assert retry_delay(20, base=0.5) == 30.0


def test_a_change_is_taken_for_gridds_own_write_only_while_or_just_after_one() -> None:
    from gridd.sources.beads_watch import is_own_echo

    assert is_own_echo(10.0, writing=1, wrote_at=None, window=0.1)
    assert is_own_echo(10.0, writing=0, wrote_at=9.95, window=0.1)
    assert not is_own_echo(10.0, writing=0, wrote_at=9.5, window=0.1)
    assert not is_own_echo(10.0, writing=0, wrote_at=None, window=0.1)


def test_the_watch_ignores_files_that_carry_no_issue_data() -> None:
    assert is_issue_data(".beads/issues.jsonl") and is_issue_data(".beads/dolt/noms/abc")
    assert not is_issue_data(".beads/daemon.log") and not is_issue_data(".beads/dolt/LOCK")


# -- the writer against the strict double ----------------------------------------------------


@pytest.fixture
def bd_dir(tmp_path: Path) -> Path:
    (tmp_path / ".beads").mkdir()
    return tmp_path


def write_db(root: Path, **db: object) -> None:
    (root / ".beads" / "fake-bd.json").write_text(json.dumps(db))


def read_issue(root: Path, bead_id: str) -> dict[str, object]:
    return bd_issue(root, bead_id)


def writer_for(root: Path, store: Store, **settings: object) -> tuple[BeadWriter, EventBus]:
    bus = EventBus(store, queue_size=1000)
    command = [sys.executable, str(FAKE_BD)]
    beads = BeadsSettings(command=command, **settings)  # type: ignore[arg-type]

    async def run(args: list[str]) -> BdResult:
        return await run_bd(command, args, cwd=root)

    return BeadWriter(run=run, bus=bus, background=Background(), settings=beads), bus


def errors_of(store: Store) -> list[dict[str, object]]:
    return [e.data for e in store.events_after(0, types=["beads.error"])]


async def test_a_failing_write_does_not_hold_up_another_bead(bd_dir: Path) -> None:
    issues = [bead(i, status="in_progress", assignee="gridd") for i in ("bd-1", "bd-2")]
    write_db(bd_dir, issues=issues, flaky={"bd-1": 1000})
    store = Store.open(bd_dir / "g.db")
    try:
        writer, _bus = writer_for(bd_dir, store, retry_seconds=0.2, write_attempts=20)
        settings = writer.settings
        for bead_id in ("bd-1", "bd-2"):
            writer.submit(
                bead_id, mirror_writes(bead_id, "review", previous="working", settings=settings)
            )
        await until(lambda: "gridd:review" in (read_issue(bd_dir, "bd-2").get("labels") or []))
        assert "gridd:review" not in (read_issue(bd_dir, "bd-1").get("labels") or [])
        await until(lambda: len(errors_of(store)) >= 2)
        first = errors_of(store)[0]
        assert first["taskId"] == "bd-1" and first["permanent"] is False
        assert first["retryInSeconds"] == 0.2
        # bd comes back: the retried write lands, in order, and the lane ends.
        edit_bd_db(bd_dir, lambda db: db.update(flaky={}))
        await until(lambda: "gridd:review" in (read_issue(bd_dir, "bd-1").get("labels") or []))
        await until(lambda: writer.pending("bd-1") == 0)
    finally:
        await writer.background.stop()
        store.close()


async def test_writes_to_one_bead_land_in_order_after_retries(bd_dir: Path) -> None:
    write_db(
        bd_dir, issues=[bead("bd-1", status="in_progress", assignee="gridd")], flaky={"bd-1": 2}
    )
    store = Store.open(bd_dir / "g.db")
    try:
        writer, _bus = writer_for(bd_dir, store, retry_seconds=0.05)
        s = writer.settings
        writer.submit("bd-1", mirror_writes("bd-1", "review", previous="working", settings=s))
        writer.submit(
            "bd-1", mirror_writes("bd-1", "failed", previous="review", settings=s, error="exit 3")
        )
        await until(lambda: len(read_issue(bd_dir, "bd-1").get("comments") or []) == 1)
        issue = read_issue(bd_dir, "bd-1")
        assert issue["status"] == "open" and issue["assignee"] == ""
        assert issue["labels"] == ["gridd:failed"]
        assert errors_of(store)[-1]["attempt"] == 2  # two transient failures, then success
    finally:
        await writer.background.stop()
        store.close()


async def test_a_permanent_refusal_is_reported_once_and_not_retried(bd_dir: Path) -> None:
    # review_status names a status this bd was never configured with
    write_db(bd_dir, issues=[bead("bd-1", status="in_progress", assignee="gridd")])
    store = Store.open(bd_dir / "g.db")
    try:
        writer, _bus = writer_for(bd_dir, store, review_status="review", retry_seconds=0.05)
        writer.submit(
            "bd-1", mirror_writes("bd-1", "review", previous="working", settings=writer.settings)
        )
        await until(lambda: writer.pending("bd-1") == 0 and errors_of(store))
        (error,) = errors_of(store)
        assert error["permanent"] is True and error["retryInSeconds"] is None
        assert "invalid status" in str(error["error"])
        # with the custom status configured in bd, the same write is accepted
        write_db(
            bd_dir,
            issues=[bead("bd-1", status="in_progress")],
            config={"status.custom": "review:wip"},
        )
        writer.submit(
            "bd-1", mirror_writes("bd-1", "review", previous="working", settings=writer.settings)
        )
        await until(lambda: read_issue(bd_dir, "bd-1")["status"] == "review")
        assert len(errors_of(store)) == 1
    finally:
        await writer.background.stop()
        store.close()


# -- the round trip through a daemon ------------------------------------------------------------


def test_a_failed_bead_is_reopened_with_a_label_and_a_comment(repo: Path) -> None:
    setup_beads(
        repo,
        [bead("bd-f")],
        extra='default_agent = "broken"\n'
        "[scheduler]\nbackoff_seconds = 0.05\n"
        '[agents.broken]\ncommand = ["sh", "-c", "echo boom; exit 3"]\n',
    )
    with running_daemon(repo) as d:
        c = d.client()
        wait_for(lambda: len(c.get("/tasks")) == 1, timeout=20, message="bead imported")
        c.post("/session/start", {"featureBranch": "beads-fail", "maxAgents": 1})
        wait_for(
            lambda: c.get("/tasks")[0]["status"] == "failed", timeout=60, message="task failed"
        )
        wait_for(
            lambda: bd_issue(repo, "bd-f").get("comments"), timeout=20, message="comment written"
        )
        issue = bd_issue(repo, "bd-f")
        assert issue["status"] == "open" and not issue.get("assignee")
        assert "gridd:failed" in (issue.get("labels") or [])
        (comment,) = issue["comments"]  # type: ignore[misc]
        assert comment["text"].startswith("gridd: the task failed")
        assert not list(c.events(since=0, types=["beads.error"], read_timeout=1))
        c.post("/session/stop")


def test_a_new_bead_is_seen_through_the_file_watch_with_the_poll_off(repo: Path) -> None:
    setup_beads(repo, [bead("bd-0")])
    config = repo / ".grid" / "config.toml"
    config.write_text(config.read_text().replace("poll_seconds = 0.2", "poll_seconds = 0"))
    with running_daemon(repo) as d:
        c = d.client()
        wait_for(lambda: len(c.get("/tasks")) == 1, timeout=20, message="first sync")
        readies = sum(1 for call in bd_calls(repo) if call[0] == "ready")
        edit_bd_db(repo, lambda db: db["issues"].append(bead("bd-new")))
        # With the poll off the watch is the only way in; how fast is bench_beads' business
        # (tens of ms on an idle machine), so the bound here only has to outlast contention.
        wait_for(lambda: len(c.get("/tasks")) == 2, timeout=10, interval=0.01, message="watch")
        # only the watch ran bd ready: one run for the change (gridd's own files are ignored)
        assert sum(1 for call in bd_calls(repo) if call[0] == "ready") == readies + 1


def test_claims_made_together_go_to_bd_in_one_call_and_each_learns_its_fate(
    bd_dir: Path,
) -> None:
    import asyncio

    from gridd.sources.beads_claim import ClaimBatcher

    write_db(bd_dir, issues=[bead("a"), bead("b"), bead("r", race=True)])
    command = [sys.executable, str(FAKE_BD)]

    async def main() -> list[str | None]:
        background = Background()
        batcher = ClaimBatcher(lambda args: run_bd(command, args, cwd=bd_dir), background)
        try:
            return list(await asyncio.gather(*(batcher.claim(i) for i in ("a", "b", "r", "gone"))))
        finally:
            await background.stop()

    a, b, r, gone = asyncio.run(main())
    assert a is None and b is None
    assert r == "issue already claimed by rival"
    assert gone is not None and "no issue found" in gone
    claims = [c for c in bd_calls(bd_dir) if c[0] == "update"]
    assert claims == [["update", "a", "b", "r", "gone", "--claim", "--json"]]
    assert read_issue(bd_dir, "a")["status"] == "in_progress"


async def test_the_same_write_to_several_beads_is_one_bd_call_and_each_learns_its_fate(
    bd_dir: Path,
) -> None:
    issues = [bead(i, status="in_progress", assignee="gridd") for i in ("bd-1", "bd-2")]
    write_db(bd_dir, issues=issues)
    store = Store.open(bd_dir / "g.db")
    try:
        writer, _bus = writer_for(bd_dir, store, retry_seconds=0.05)
        s = writer.settings
        for bead_id in ("bd-1", "bd-gone", "bd-2"):
            writer.submit(bead_id, mirror_writes(bead_id, "review", previous="working", settings=s))
        await until(lambda: not any(writer.pending(b) for b in ("bd-1", "bd-2", "bd-gone")))
        for bead_id in ("bd-1", "bd-2"):
            assert "gridd:review" in (read_issue(bd_dir, bead_id).get("labels") or [])
        flags = ["--status", "in_progress", "--add-label", "gridd:review", "--json"]
        assert bd_calls(bd_dir) == [["update", "bd-1", "bd-gone", "bd-2", *flags]]
        # the bead bd does not know is refused alone, once (not retried)
        (error,) = errors_of(store)
        assert error["taskId"] == "bd-gone" and error["permanent"] is True
        assert "no issue found" in str(error["error"])
    finally:
        await writer.background.stop()
        store.close()
