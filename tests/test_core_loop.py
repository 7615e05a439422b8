"""The core loop with real daemons, real git and real agent processes: plans run in
dependency order within maxAgents, failures retry then fail, timeouts kill the whole
process group, stopping a session (gracefully, forcibly, or by the STOP file) keeps work."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from gridd.client import GridClient
from tests.support.api import scheduler_starts, wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git
from tests.support.processes import process_gone
from tests.support.repos import agent_command, read_json_file, read_text_file, write_core_config
from tests.support.sse import event_log, wait_for_events
from tests.support.waits import wait_for

AGENT_END = {"agent.completed", "agent.failed", "agent.stopped"}
AGENT_EVENTS = {"agent.spawned", *AGENT_END}


def status(c: GridClient, task_id: str) -> str:
    return str(c.get(f"/tasks/{task_id}")["status"])


def peak_live_agents(agents: Sequence[dict[str, Any]]) -> int:
    """Most agent processes alive at once: each from its recorded start to the exit time its
    shim wrote to ``exit.json``. Not from events: a slot is free from the agent's exit, before
    its work is committed and ``agent.completed`` published, so events overstate overlap."""
    spans = []
    for agent in agents:
        ended = json.loads((Path(agent["runDir"]) / "exit.json").read_text())["endedAt"]
        started = datetime.fromisoformat(agent["startedAt"].replace("Z", "+00:00"))
        spans.append((started.timestamp(), float(ended)))
    return max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)


# -- plans run in dependency order, within maxAgents -------------------------------------------

THREE_WAVES = [
    {"id": "a1", "title": "wave 0, first"},
    {"id": "a2", "title": "wave 0, second"},
    {"id": "a3", "title": "wave 0, third"},
    {"id": "b1", "title": "needs a1 and a2", "dependsOn": ["a1", "a2"]},
    {"id": "b2", "title": "needs a3", "dependsOn": ["a3"]},
    {"id": "b3", "title": "needs a1", "dependsOn": ["a1"]},
    {"id": "c1", "title": "needs b1 and b2", "dependsOn": ["b1", "b2"]},
    {"id": "c2", "title": "needs b3", "dependsOn": ["b3"]},
]


def test_a_three_wave_plan_runs_in_dependency_order_within_max_agents(repo: Path) -> None:
    write_core_config(
        repo,
        agents={"work": {"command": agent_command("trivial.py", "1.5")}},
        scheduler={"default_agent": "work"},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        plan = c.post("/plans", {"tasks": THREE_WAVES})
        assert plan["waves"] == [["a1", "a2", "a3"], ["b1", "b2", "b3"], ["c1", "c2"]]
        assert c.get("/plan")["waves"] == plan["waves"]
        c.post("/session/start", {"featureBranch": "feature/waves", "maxAgents": 2})

        for tid in ("a1", "a2", "a3"):
            wait_task_status(c, tid, "review")
        # Dependencies in review are not done: nothing of wave 1 may start.
        assert scheduler_starts(c) == []  # asked now, the scheduler starts nothing
        assert {status(c, t) for t in ("b1", "b2", "b3", "c1", "c2")} == {"pending"}
        assert c.get("/agents") == []

        # Approving a1 alone frees b3 (needs a1) but not b1 (needs a1 and a2).
        assert c.post("/tasks/a1/approve")["status"] == "merging"  # done once merged
        wait_task_status(c, "b3", "review")
        assert status(c, "b1") == "pending"
        assert status(c, "b2") == "pending"
        for tid in ("a2", "a3"):
            c.post(f"/tasks/{tid}/approve")
        for tid in ("b1", "b2"):
            wait_task_status(c, tid, "review")
        assert {status(c, "c1"), status(c, "c2")} == {"pending"}
        for tid in ("b1", "b2", "b3"):
            c.post(f"/tasks/{tid}/approve")
        for tid in ("c1", "c2"):
            wait_task_status(c, tid, "review")
            c.post(f"/tasks/{tid}/approve")

        events = event_log(c, types=AGENT_EVENTS)
        spawned = [e for e in events if e.type == "agent.spawned"]
        # Each task ran exactly once, all successfully, never more than two at a time.
        assert sorted(e.data["taskId"] for e in spawned) == sorted(t["id"] for t in THREE_WAVES), [
            (e.id, e.type, e.data.get("taskId"), e.data.get("agentId")) for e in events
        ]
        assert [e.type for e in events if e.type in AGENT_END] == ["agent.completed"] * 8
        assert peak_live_agents(c.get("/agents", params={"all": "1"})) == 2
        # A task started only after each of its dependencies had completed.
        completed_at = {e.data["taskId"]: e.id for e in events if e.type == "agent.completed"}
        for e in spawned:
            spec = next(t for t in THREE_WAVES if t["id"] == e.data["taskId"])
            for dep in spec.get("dependsOn", []):
                assert completed_at[dep] < e.id, (e.data["taskId"], dep)
        # Each branch holds its agent's work, and the feature branch holds every branch.
        for tid in ("c1", "c2"):
            wait_task_status(c, tid, "done")
        feature = git(repo, "rev-parse", "feature/waves").strip()
        for spec in THREE_WAVES:
            tid = spec["id"]
            task = c.get(f"/tasks/{tid}")
            assert task["status"] == "done"
            assert task["branch"] == f"grid/{tid}"
            assert task["changedFiles"] == [f"{tid}.txt"]
            assert (
                git(repo, "merge-base", feature, f"grid/{tid}").strip()
                == git(repo, "rev-parse", f"grid/{tid}").strip()
            )
            assert git(repo, "show", f"grid/{tid}:{tid}.txt") == f"work for {tid}\n"
            assert git(repo, "show", f"{feature}:{tid}.txt") == f"work for {tid}\n"


def test_a_profile_concurrency_limit_holds_even_while_agents_are_starting(repo: Path) -> None:
    write_core_config(
        repo,
        agents={
            "solo": {"command": agent_command("trivial.py", "0.5"), "concurrency": 1},
            "duo": {"command": agent_command("trivial.py", "0.5"), "concurrency": 2},
        },
    )
    tasks = [{"id": f"solo-{i}", "title": "t", "agent": "solo"} for i in range(3)]
    tasks += [{"id": f"duo-{i}", "title": "t", "agent": "duo"} for i in range(4)]
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/plans", {"tasks": tasks})
        c.post("/session/start", {"maxAgents": 10})
        for spec in tasks:
            wait_task_status(c, spec["id"], "review", timeout=60)
        events = event_log(c, types=AGENT_EVENTS)
        agents = c.get("/agents", params={"all": "1"})
    for profile, limit in (("solo", 1), ("duo", 2)):
        mine = [e for e in events if e.data["agentId"].startswith(f"{profile}-")]
        assert len([e for e in mine if e.type == "agent.spawned"]) == len(
            [t for t in tasks if t["agent"] == profile]
        )
        assert peak_live_agents([a for a in agents if a["profile"] == profile]) <= limit, profile


def test_the_bundled_example_agent_leaves_its_work_on_the_task_branch(repo: Path) -> None:
    with core_daemon(repo, env={"GRID_EXAMPLE_DELAY": "0"}) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "demo", "title": "Demo", "prompt": "write notes"})
        c.post("/session/start", {"featureBranch": "feature/demo", "maxAgents": 1})
        task = wait_task_status(c, "demo", "review")
        # The agent committed notes itself and left src/ for gridd to commit.
        assert task["changedFiles"] == ["notes/demo.md", "src/demo.py"]
        assert "PROMPT = 'write notes'" in git(repo, "show", "grid/demo:src/demo.py")
        assert git(repo, "-C", task["worktree"], "status", "--porcelain") == ""
        completed = [e.data for e in event_log(c, types={"agent.completed"})]
        assert completed[0]["changedFiles"] == task["changedFiles"]
        assert completed[0]["result"] == "success"


# -- failure and retries ---------------------------------------------------------------------------


def test_a_failing_agent_is_retried_up_to_max_attempts_then_its_task_fails(repo: Path) -> None:
    write_core_config(repo, agents={"fail": {"command": agent_command("fail.py", "3")}})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post(
            "/plans",
            {
                "tasks": [
                    {"id": "doomed", "title": "fails", "agent": "fail", "maxAttempts": 3},
                    {"id": "after", "title": "needs doomed", "dependsOn": ["doomed"]},
                ]
            },
        )
        c.post("/session/start", {"maxAgents": 2})
        task = wait_task_status(c, "doomed", "failed")
        assert task["attempts"] == 3
        assert "exited with code 3" in task["error"]
        # The dependant can never run: it is blocked, naming the failed dependency.
        after = wait_task_status(c, "after", "blocked")
        assert "doomed" in after["error"]

        events = event_log(c, types=AGENT_EVENTS)
        failed = [e.data for e in events if e.type == "agent.failed"]
        assert [f["exitCode"] for f in failed] == [3, 3, 3]
        assert all(f["taskId"] == "doomed" and "code 3" in f["error"] for f in failed)
        spawned = [e.data for e in events if e.type == "agent.spawned"]
        assert [s["attempt"] for s in spawned] == [1, 2, 3]
        assert len({s["agentId"] for s in spawned}) == 3
        # Each agent's own output says which attempt it was.
        agent = c.get(f"/agents/{spawned[-1]['agentId']}")
        assert agent["exitCode"] == 3
        output = c.get(f"/agents/{agent['id']}/output")
        assert "attempt 3, exit 3" in "".join(ch["chunk"] for ch in output["chunks"])


def test_a_failed_task_started_again_gets_a_fresh_set_of_attempts(repo: Path) -> None:
    write_core_config(repo, agents={"fail": {"command": agent_command("fail.py", "7")}})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "again", "title": "fails", "agent": "fail", "maxAttempts": 1})
        c.post("/tasks/again/start")
        assert wait_task_status(c, "again", "failed")["attempts"] == 1
        assert c.post("/tasks/again/start")["status"] == "working"
        task = wait_task_status(c, "again", "failed")
        assert task["attempts"] == 1
        failed = [e.data for e in event_log(c, types={"agent.failed"})]
        assert [f["exitCode"] for f in failed] == [7, 7]


# -- timeouts ------------------------------------------------------------------------------------


def test_a_hanging_agent_is_killed_with_its_whole_process_group_at_its_timeout(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        agents={
            "hang": {"command": agent_command("hang.py", str(tmp_path))},
            "hang_limited": {
                "command": agent_command("hang.py", str(tmp_path)),
                "timeout_seconds": 1.5,
            },
        },
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post(
            "/tasks",
            [
                {
                    "id": "task-timeout",
                    "title": "hangs",
                    "agent": "hang",
                    "timeoutSeconds": 1.5,
                    "maxAttempts": 1,
                },
                {
                    "id": "profile-timeout",
                    "title": "hangs",
                    "agent": "hang_limited",
                    "maxAttempts": 1,
                },
            ],
        )
        c.post("/session/start", {"maxAgents": 2})
        pids = {
            tid: wait_for(lambda tid=tid: read_json_file(tmp_path / f"{tid}.pids"), timeout=30)
            for tid in ("task-timeout", "profile-timeout")
        }
        for tid in pids:
            task = wait_task_status(c, tid, "failed")
            assert "timeout after 1.5s" in task["error"]
        # The child ignores SIGTERM: only a SIGKILL to the whole group ends it.
        for tid, p in pids.items():
            wait_for(lambda p=p: process_gone(p["agent"]), timeout=15, message=f"{tid} agent")
            wait_for(lambda p=p: process_gone(p["child"]), timeout=15, message=f"{tid} child")
        failed = [e.data for e in event_log(c, types={"agent.failed"})]
        assert sorted(f["taskId"] for f in failed) == ["profile-timeout", "task-timeout"]
        assert all("timeout" in f["error"] for f in failed)


# -- stopping the session -------------------------------------------------------------------------


def stopper_config(repo: Path, pid_dir: Path, **scheduler: object) -> None:
    write_core_config(
        repo,
        agents={
            "polite": {"command": agent_command("stubborn.py", str(pid_dir), "exit")},
            "stubborn": {"command": agent_command("stubborn.py", str(pid_dir), "ignore")},
        },
        scheduler=scheduler,
    )


def start_stoppable_tasks(c: GridClient, pid_dir: Path) -> dict[str, int]:
    c.post(
        "/tasks",
        [
            {"id": "polite", "title": "exits on SIGTERM", "agent": "polite"},
            {"id": "stubborn", "title": "ignores SIGTERM", "agent": "stubborn"},
        ],
    )
    c.post("/session/start", {"featureBranch": "feature/stop", "maxAgents": 2})
    return {
        tid: int(wait_for(lambda tid=tid: read_text_file(pid_dir / f"{tid}.pid"), timeout=30))
        for tid in ("polite", "stubborn")
    }


def assert_partial_work_committed(repo: Path, c: GridClient, tid: str) -> None:
    task = c.get(f"/tasks/{tid}")
    assert git(repo, "show", f"grid/{tid}:partial-{tid}.txt") == f"half-done work for {tid}\n"
    assert git(repo, "-C", task["worktree"], "status", "--porcelain") == ""


def test_stopping_the_session_terms_agents_kills_stubborn_ones_and_keeps_their_work(
    repo: Path, tmp_path: Path
) -> None:
    stopper_config(repo, tmp_path, stop_grace_seconds=1.5)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        pids = start_stoppable_tasks(c, tmp_path)
        session = c.post("/session/stop")
        assert session["started"] is False
        for tid, pid in pids.items():
            wait_for(lambda pid=pid: process_gone(pid), timeout=20, message=f"{tid} to end")
        wait_for_events(c, {"agent.stopped"}, 2)
        # SIGTERM reached both; the polite one left, the stubborn one needed SIGKILL.
        for tid in pids:
            assert "SIGTERM received" in (tmp_path / f"{tid}.term").read_text()
        stopped = {e.data["taskId"]: e.data for e in event_log(c, types={"agent.stopped"})}
        assert stopped["polite"]["exitCode"] == 143
        assert stopped["stubborn"]["exitCode"] == 128 + 9
        assert all(s["committedWork"] for s in stopped.values())
        for tid in pids:
            assert status(c, tid) == "ready"
            assert_partial_work_committed(repo, c, tid)
        reasons = [e.data["reason"] for e in event_log(c, types={"session.stopped"})]
        assert reasons == ["user"]
        assert not [e for e in event_log(c, types={"agent.failed", "agent.completed"})]


def test_force_stop_kills_agents_at_once_and_keeps_their_work(repo: Path, tmp_path: Path) -> None:
    # A grace period longer than the test waits: only an immediate SIGKILL can pass.
    stopper_config(repo, tmp_path, stop_grace_seconds=120)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        pids = start_stoppable_tasks(c, tmp_path)
        c.post("/session/stop", params={"force": "1"})
        for tid, pid in pids.items():
            wait_for(lambda pid=pid: process_gone(pid), timeout=20, message=f"{tid} to die")
        wait_for_events(c, {"agent.stopped"}, 2)
        for tid in pids:
            assert not (tmp_path / f"{tid}.term").exists()  # no SIGTERM first
            assert status(c, tid) == "ready"
            assert_partial_work_committed(repo, c, tid)
        stopped = event_log(c, types={"agent.stopped"})
        assert sorted(e.data["exitCode"] for e in stopped) == [137, 137]
        assert [e.data["force"] for e in event_log(c, types={"session.stopped"})] == [True]


def test_a_graceful_stop_can_be_escalated_to_a_force_stop(repo: Path, tmp_path: Path) -> None:
    stopper_config(repo, tmp_path, stop_grace_seconds=120)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        pids = start_stoppable_tasks(c, tmp_path)
        c.post("/session/stop")
        wait_for(lambda: process_gone(pids["polite"]), timeout=20)
        wait_for(lambda: (tmp_path / "stubborn.term").exists(), timeout=20)
        assert not process_gone(pids["stubborn"])  # still in its (long) grace period
        c.post("/session/stop", params={"force": "1"})
        wait_for(lambda: process_gone(pids["stubborn"]), timeout=20)
        wait_for_events(c, {"agent.stopped"}, 2)
        assert status(c, "stubborn") == "ready"


def test_the_stop_file_stops_the_session_at_the_next_pass(repo: Path, tmp_path: Path) -> None:
    stopper_config(repo, tmp_path)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        pids = start_stoppable_tasks(c, tmp_path)
        stop_file = repo / ".grid" / "STOP"
        stop_file.write_text("")
        wait_for(lambda: not c.get("/state")["session"]["started"], timeout=20)
        assert [e.data["reason"] for e in event_log(c, types={"session.stopped"})] == ["stop_file"]
        for tid, pid in pids.items():
            wait_for(lambda pid=pid: process_gone(pid), timeout=20, message=f"{tid} to end")
        wait_for_events(c, {"agent.stopped"}, 2)
        assert not stop_file.exists()  # consumed: the next session is not stopped at once
        for tid in pids:
            assert status(c, tid) == "ready"
            assert_partial_work_committed(repo, c, tid)
        # A new session picks the tasks up again, in the worktrees that kept their work.
        for tid in pids:
            (tmp_path / f"{tid}.pid").unlink()
        c.post("/session/start", {"featureBranch": "feature/stop", "maxAgents": 2})
        for tid in pids:
            wait_for(lambda tid=tid: (tmp_path / f"{tid}.pid").exists(), timeout=30)
            assert status(c, tid) == "working"
        assert c.get("/state")["session"]["started"] is True
