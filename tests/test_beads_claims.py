"""Claiming beads off the critical path: claims made ahead of a free slot, agents started
while their claim is in flight, and claims sent while another bd call is under way."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from gridd.background import Background
from gridd.model import Task, TaskStatus
from gridd.sources.bd import run_bd
from gridd.sources.beads_claim import ClaimBatcher, unused_claims, worth_claiming
from tests.support.daemons import running_daemon
from tests.support.waits import wait_for
from tests.test_beads import FAKE_BD, bd_calls, bd_issue, bead, setup_beads


def write_db(repo: Path, issues: list[dict[str, object]], **extra: object) -> None:
    (repo / ".beads" / "fake-bd.json").write_text(json.dumps({"issues": issues, **extra}))


def agent_config(command: list[str], **beads: object) -> str:
    lines = ['default_agent = "worker"'] + [f"{k} = {json.dumps(v)}" for k, v in beads.items()]
    return "\n".join(lines) + f"\n[agents.worker]\ncommand = {json.dumps(command)}\n"


def kept_file(repo: Path, stopped: dict[str, object], path: str = "out.txt") -> str:
    """What the run set aside by ``agent.stopped`` left in ``path`` on its kept branch."""
    branch = stopped["keptBranch"]
    assert branch == f"grid-kept/{stopped['taskId']}-{stopped['agentId']}"
    return subprocess.run(
        ["git", "show", f"{branch}:{path}"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def branch_exists(repo: Path, branch: str) -> bool:
    out = subprocess.run(
        ["git", "branch", "--list", branch], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    return bool(out.strip())


def task(task_id: str, status: TaskStatus, *, priority: int = 2, **fields: object) -> Task:
    created = datetime(2026, 11, 1, tzinfo=UTC)
    return Task.model_validate(
        {
            "id": task_id,
            "title": task_id,
            "status": status,
            "priority": priority,
            "source": "beads",
            "created_at": created,
            "updated_at": created,
            **fields,
        }
    )


def test_the_beads_worth_claiming_are_the_next_first_attempts_in_start_order() -> None:
    tasks = [
        task("late", TaskStatus.READY, priority=3),
        task("first", TaskStatus.READY, priority=0),
        task("second", TaskStatus.READY, priority=1),
        task("running", TaskStatus.WORKING, priority=0),
        task("retry", TaskStatus.READY, priority=0, attempts=1, branch="grid/retry"),
        task("native", TaskStatus.READY, priority=0).model_copy(update={"source": "native"}),
    ]
    assert worth_claiming(tasks, source="beads", held=[], limit=2) == ["first", "second"]
    assert worth_claiming(tasks, source="beads", held=["first"], limit=2) == ["second"]
    assert worth_claiming(tasks, source="beads", held=[], limit=0) == []
    by_id = {t.id: t for t in tasks}
    assert unused_claims(by_id, ["first", "running", "retry", "gone"]) == ["first"]


def test_claims_made_while_a_bd_call_is_under_way_go_in_the_next_call(tmp_path: Path) -> None:
    (tmp_path / ".beads").mkdir()
    write_db(tmp_path, [bead("a"), bead("b")], delay={"a": 0.5})
    command = [sys.executable, str(FAKE_BD)]

    async def main() -> tuple[str | None, str | None]:
        background = Background()
        batcher = ClaimBatcher(lambda args: run_bd(command, args, cwd=tmp_path), background)
        try:
            first = asyncio.ensure_future(batcher.claim("a"))
            await asyncio.sleep(0.2)  # "a" is with bd now
            second = await asyncio.wait_for(batcher.claim("b"), 10)
            return await first, second
        finally:
            await background.stop()

    assert asyncio.run(main()) == (None, None)
    claims = [c for c in bd_calls(tmp_path) if c[0] == "update"]
    assert claims == [["update", "a", "--claim", "--json"], ["update", "b", "--claim", "--json"]]


def test_a_claim_lost_while_its_agent_runs_stops_it_keeps_its_work_aside_and_leaves_the_bead(
    repo: Path,
) -> None:
    # bd answers the claims after 1.5 s, by which time both agents have started: bd-quick's
    # has already exited with work in its worktree, bd-slow's is still running.
    agent = ["sh", "-c", 'echo work > out.txt; [ "$GRID_TASK_ID" = bd-quick ] || sleep 60']
    setup_beads(repo, [], extra=agent_config(agent, claim_ahead=0))
    racing = [bead("bd-quick", race=True), bead("bd-slow", race=True)]
    write_db(repo, racing, delay={"bd-quick": 1.5, "bd-slow": 1.5})
    with running_daemon(repo) as d:
        c = d.client()
        wait_for(lambda: len(c.get("/tasks")) == 2, timeout=20, message="beads imported")
        c.post("/session/start", {"featureBranch": "beads-race", "maxAgents": 2})

        def cancelled() -> bool:
            return all(t["status"] == "cancelled" for t in c.get("/tasks"))

        wait_for(cancelled, timeout=30, message="both claims lost")
        types = ["agent.spawned", "agent.stopped", "agent.completed", "beads.claim_lost"]
        wait_for(
            lambda: (
                len([e for e in c.events(since=0, types=["agent.stopped"], read_timeout=0.5)]) == 2
            ),
            timeout=30,
            message="both agents finished",
        )
        events = list(c.events(since=0, types=types, read_timeout=1))
        assert sorted(e.data["taskId"] for e in events if e.type == "agent.spawned") == [
            "bd-quick",
            "bd-slow",
        ]
        stopped = [e.data for e in events if e.type == "agent.stopped"]
        assert {s["taskId"] for s in stopped} == {"bd-quick", "bd-slow"}
        assert all(s["reason"] == "claim lost" and not s["committedWork"] for s in stopped)
        assert not [e for e in events if e.type == "agent.completed"]
        assert sorted(e.data["taskId"] for e in events if e.type == "beads.claim_lost") == [
            "bd-quick",
            "bd-slow",
        ]
        for bead_id in ("bd-quick", "bd-slow"):
            assert not branch_exists(repo, f"grid/{bead_id}")
            assert not (repo / ".grid" / "worktrees" / bead_id).exists()
            assert bd_issue(repo, bead_id)["assignee"] == "rival"
            # the claim was the only write naming it: gridd left the rival's bead alone
            writes = [call for call in bd_calls(repo) if call[0] != "ready" and bead_id in call]
            assert len(writes) == 1 and "--claim" in writes[0]
        # Never the task's, never thrown away: each run's work is on a branch of its own.
        assert [kept_file(repo, s).strip() for s in stopped] == ["work", "work"]
        assert not c.get("/agents")  # none live
        c.post("/session/stop")


def test_the_next_beads_are_claimed_ahead_and_given_back_when_the_session_stops(
    repo: Path,
) -> None:
    issues = [
        bead("bd-1", priority=0),
        bead("bd-2", priority=1),
        bead("bd-race", priority=1, race=True),
        bead("bd-4", priority=2),
        bead("bd-5", priority=3),
    ]
    setup_beads(repo, issues, extra=agent_config(["sleep", "60"], claim_ahead=2))
    with running_daemon(repo) as d:
        c = d.client()
        wait_for(lambda: len(c.get("/tasks")) == 5, timeout=20, message="beads imported")
        assert not [call for call in bd_calls(repo) if call[0] == "update"]  # no session yet
        c.post("/session/start", {"featureBranch": "beads-ahead", "maxAgents": 1})

        def status(bead_id: str) -> object:
            return bd_issue(repo, bead_id)["status"]

        # bd-1 runs; the two next (bd-2, bd-race) are claimed ahead; bd-race is lost to a
        # rival, so its task is cancelled without an agent and bd-4 is claimed in its place.
        wait_for(
            lambda: status("bd-2") == status("bd-4") == "in_progress",
            timeout=30,
            message="claimed ahead",
        )
        tasks = {t["id"]: t for t in c.get("/tasks")}
        assert tasks["bd-1"]["status"] == "working"
        assert tasks["bd-2"]["status"] == tasks["bd-4"]["status"] == "ready"
        assert tasks["bd-race"]["status"] == "cancelled"
        assert status("bd-5") == "open" and not bd_issue(repo, "bd-5").get("assignee")
        spawned = [
            e.data["taskId"] for e in c.events(since=0, types=["agent.spawned"], read_timeout=1)
        ]
        assert spawned == ["bd-1"]

        c.post("/session/stop")
        wait_for(
            lambda: status("bd-2") == status("bd-4") == "open",
            timeout=30,
            message="unused claims given back",
        )
        for bead_id in ("bd-2", "bd-4"):
            assert not bd_issue(repo, bead_id).get("assignee")
            writes = [c for c in bd_calls(repo) if c[0] == "update" and bead_id in c]
            assert "--claim" in writes[0] and "--claim" not in writes[-1]
        # both given back in one bd call: the same change to several beads is batched
        releases = [c for c in bd_calls(repo) if c[0] == "update" and "open" in c]
        assert releases == [
            ["update", "bd-2", "bd-4", "--status", "open", "--assignee", "", "--json"]
        ]
        assert bd_issue(repo, "bd-race")["assignee"] == "rival"
        assert not [e for e in c.events(since=0, types=["beads.error"], read_timeout=1)]


def test_a_daemon_killed_before_the_claims_answer_asks_again_and_a_loss_commits_nothing(
    repo: Path,
) -> None:
    import contextlib

    import httpx

    from gridd.errors import DaemonUnreachable
    from tests.support.daemons import restartable_daemon

    agent = ["sh", "-c", "echo work > out.txt; sleep 60"]
    extra = agent_config(agent, claim_ahead=0)
    setup_beads(repo, [], extra=extra + '[daemon]\ncrash_points = ["spawn.started"]\n')
    write_db(repo, [bead("bd-late", race=True)], delay={"bd-late": 1.0})
    config = repo / ".grid" / "config.toml"
    with restartable_daemon(repo) as grid:
        c = grid.client()
        wait_for(lambda: len(c.get("/tasks")) == 1, timeout=20, message="bead imported")
        # The agent starts while its claim is with bd, and the daemon dies at once (kill -9).
        with contextlib.suppress(DaemonUnreachable, httpx.TransportError):
            c.post("/session/start", {"featureBranch": "beads-kill", "maxAgents": 1})
        assert grid.daemon is not None
        assert grid.daemon.proc.wait(30) is not None
        config.write_text(setup_text := config.read_text().split("[daemon]")[0])
        assert "crash_points" not in setup_text
        grid.start()  # reattaches the run, asks bd again: the rival has the bead
        wait_for(
            lambda: c.get("/tasks")[0]["status"] == "cancelled",
            timeout=30,
            message="the loss learnt after the restart",
        )
        wait_for(lambda: not c.get("/agents"), timeout=30, message="the agent stopped")
        events = list(c.events(since=0, types=["agent.completed", "agent.stopped"], read_timeout=1))
        assert [e.type for e in events] == ["agent.stopped"]
        assert events[0].data["reason"] == "claim lost" and not events[0].data["committedWork"]
        assert not branch_exists(repo, "grid/bd-late")
        assert kept_file(repo, events[0].data).strip() == "work"
        assert bd_issue(repo, "bd-late")["assignee"] == "rival"


def test_a_claim_bd_cannot_answer_while_its_agent_runs_stops_it_and_the_task_starts_afresh(
    repo: Path,
) -> None:
    # The first claim fails as bd being down would (after 1 s, the agent running); the task
    # goes back to ready as a first attempt, claims again, and its second run is the one kept.
    agent = ["sh", "-c", 'echo "run $GRID_AGENT_ID" > out.txt; sleep 2']
    extra = agent_config(agent, claim_ahead=0) + "[scheduler]\nbackoff_seconds = 0.05\n"
    setup_beads(repo, [], extra=extra)
    write_db(repo, [bead("bd-flaky")], delay={"bd-flaky": 1.0}, flaky={"bd-flaky": 1})
    with running_daemon(repo) as d:
        c = d.client()
        wait_for(lambda: len(c.get("/tasks")) == 1, timeout=20, message="bead imported")
        c.post("/session/start", {"featureBranch": "beads-flaky", "maxAgents": 1})
        wait_for(lambda: c.get("/tasks")[0]["status"] == "review", timeout=60, message="second run")
        task = c.get("/tasks")[0]
        assert task["attempts"] == 1
        types = ["agent.spawned", "agent.stopped", "agent.completed", "task.start_failed"]
        events = [(e.type, e.data) for e in c.events(since=0, types=types, read_timeout=1)]
        assert [t for t, _ in events] == [
            "agent.spawned",
            "task.start_failed",
            "agent.stopped",
            "agent.spawned",
            "agent.completed",
        ]
        stopped = events[2][1]
        assert stopped["reason"] == "claim unanswered" and not stopped["committedWork"]
        assert kept_file(repo, stopped).strip() == f"run {stopped['agentId']}"
        kept = events[3][1]["agentId"]
        # one commit on the branch: the second run's (the first run's work was not ours)
        base = subprocess.run(
            ["git", "merge-base", "beads-flaky", "grid/bd-flaky"],
            cwd=repo, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        log = subprocess.run(
            ["git", "log", "--format=%s", f"{base}..grid/bd-flaky"],
            cwd=repo, capture_output=True, text=True, check=True,
        ).stdout.splitlines()  # fmt: skip
        assert len(log) == 1
        shown = subprocess.run(
            ["git", "show", "grid/bd-flaky:out.txt"],
            cwd=repo, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert shown.strip() == f"run {kept}"
        wait_for(
            lambda: "gridd:review" in (bd_issue(repo, "bd-flaky").get("labels") or []),
            timeout=20,
            message="review mirrored",
        )
        assert bd_issue(repo, "bd-flaky")["status"] == "in_progress"
        c.post("/session/stop")


def test_a_bd_whose_reads_touch_its_own_files_is_not_read_in_a_loop(repo: Path) -> None:
    # Every bd call (reads too) writes a file under .beads/ that looks like issue data: each
    # read's own echo is a change that is not gridd's write. It may hurry one read per
    # second; the rest keep the pause between reads (at most 5 a second).
    setup_beads(repo, [bead("bd-0")])
    noisy = ["sh", "-c", 'date +%N > .beads/side-effect.dat; exec "$0" "$@"']
    config = repo / ".grid" / "config.toml"
    text = config.read_text().replace("poll_seconds = 0.2", "poll_seconds = 0")
    command = json.dumps([*noisy, sys.executable, str(FAKE_BD)])
    config.write_text(text.replace(text.split("\n")[2], f"command = {command}"))
    with running_daemon(repo) as d:
        c = d.client()
        wait_for(lambda: len(c.get("/tasks")) == 1, timeout=20, message="first sync")

        def readies() -> int:
            return sum(1 for call in bd_calls(repo) if call[0] == "ready")

        write_db(repo, [bead("bd-0"), bead("bd-1")])  # a change: the reads begin
        wait_for(lambda: len(c.get("/tasks")) == 2, timeout=20, message="the watch saw it")
        before = readies()
        import time

        time.sleep(2.0)  # a bound on what happens over a span: nothing to await
        assert readies() - before <= 14


def test_a_run_whose_claim_cannot_be_asked_after_a_restart_is_set_aside_not_committed(
    repo: Path,
) -> None:
    # The daemon dies while the claim is with bd, and comes back with beads turned off: the
    # claim can no longer be checked. The run's work must not reach the task's branch
    # unchecked, nor be lost: it is kept aside, and the agent record stops saying it waits.
    import contextlib

    import httpx

    from gridd.errors import DaemonUnreachable
    from tests.support.daemons import restartable_daemon

    agent = ["sh", "-c", 'echo "work of $GRID_AGENT_ID" > out.txt; sleep 60']
    extra = agent_config(agent, claim_ahead=0)
    setup_beads(repo, [], extra=extra + '[daemon]\ncrash_points = ["spawn.started"]\n')
    write_db(repo, [bead("bd-late", race=True)], delay={"bd-late": 1.0})
    config = repo / ".grid" / "config.toml"
    with restartable_daemon(repo) as grid:
        c = grid.client()
        wait_for(lambda: len(c.get("/tasks")) == 1, timeout=20, message="bead imported")
        with contextlib.suppress(DaemonUnreachable, httpx.TransportError):
            c.post("/session/start", {"featureBranch": "beads-off", "maxAgents": 1})
        assert grid.daemon is not None
        assert grid.daemon.proc.wait(30) is not None
        (first,) = [p.name for p in (repo / ".grid" / "runs").iterdir() if p.is_dir()]
        text = config.read_text().split("[daemon]")[0].replace("enabled = true", "enabled = false")
        config.write_text(text)
        grid.start()

        def settled() -> bool:
            return any(a["id"] == first and a["status"] == "exited" for a in c.get("/agents?all=1"))

        wait_for(settled, timeout=30, message="the unchecked run settled")
        stopped = [
            e.data
            for e in c.events(since=0, types=["agent.stopped", "agent.completed"], read_timeout=1)
            if e.data["agentId"] == first
        ]
        assert len(stopped) == 1 and stopped[0]["reason"] == "claim unanswered"
        assert not stopped[0]["committedWork"]
        assert kept_file(repo, stopped[0]).strip() == f"work of {first}"
        record = next(a for a in c.get("/agents?all=1") if a["id"] == first)
        assert record["claimPending"] is False
        c.post("/session/stop")
