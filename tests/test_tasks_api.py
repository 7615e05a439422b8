"""The task and plan API: atomic plans that name their problems, refusals that say why
(422 for invalid values, 409 for clashes with the current state), and explicit
start/stop/approve/cancel of single tasks, with or without a session."""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gridd.client import GridClient
from tests.support.api import scheduler_starts, wait_task_status
from tests.support.daemons import DaemonProc, core_daemon
from tests.support.processes import process_gone
from tests.support.repos import (
    agent_command,
    make_repo,
    read_text_file,
    remove_repo,
    write_core_config,
)
from tests.support.sse import event_log, wait_for_events
from tests.support.waits import wait_for


@pytest.fixture(scope="module")
def shared() -> Iterator[DaemonProc]:
    """One daemon for the tests that only create and inspect tasks (no agents run)."""
    root = make_repo()
    write_core_config(root, agents={"custom": {"command": agent_command("trivial.py")}})
    try:
        with core_daemon(root) as daemon:
            yield daemon
    finally:
        remove_repo(root)


def raw(c: GridClient) -> httpx.Client:
    return c._http


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    return error


# -- plans are atomic and name their problems ---------------------------------------------------


def test_a_plan_with_a_cycle_is_rejected_naming_the_cycle_and_nothing_is_applied(
    shared: DaemonProc,
) -> None:
    c = shared.client()
    c.post("/tasks", {"id": "cyc-base", "title": "exists before"})
    before = c.get("/tasks")
    plan = {
        "tasks": [
            {"id": "cyc-free", "title": "fine on its own"},
            {"id": "cyc-a", "title": "a", "dependsOn": ["cyc-c", "cyc-base"]},
            {"id": "cyc-b", "title": "b", "dependsOn": ["cyc-a"]},
            {"id": "cyc-c", "title": "c", "dependsOn": ["cyc-b"]},
        ]
    }
    error = error_of(raw(c).post("/plans", json=plan), 422)
    assert error["code"] == "plan_cycle"
    for tid in ("cyc-a", "cyc-b", "cyc-c"):
        assert tid in error["message"]
    assert "cyc-free" not in error["message"]
    assert c.get("/tasks") == before


def test_a_yaml_plan_with_a_cycle_is_rejected_like_a_json_one(shared: DaemonProc) -> None:
    c = shared.client()
    before = c.get("/tasks")
    text = yaml.safe_dump(
        {
            "tasks": [
                {"id": "ycyc-x", "title": "x", "depends_on": ["ycyc-y"]},
                {"id": "ycyc-y", "title": "y", "after": "ycyc-x"},
            ]
        }
    )
    response = raw(c).post(
        "/plans", content=text.encode(), headers={"content-type": "application/yaml"}
    )
    error = error_of(response, 422)
    assert "ycyc-x" in error["message"] and "ycyc-y" in error["message"]
    assert c.get("/tasks") == before


def test_a_plan_naming_an_unknown_dependency_is_rejected_and_nothing_applied(
    shared: DaemonProc,
) -> None:
    c = shared.client()
    before = c.get("/tasks")
    plan = {
        "tasks": [
            {"id": "unk-a", "title": "a"},
            {"id": "unk-b", "title": "b", "dependsOn": ["unk-a", "no-such-task"]},
        ]
    }
    error = error_of(raw(c).post("/plans", json=plan), 422)
    assert error["code"] == "plan_unknown_dependency"
    assert "no-such-task" in error["message"] and "unk-b" in error["message"]
    assert c.get("/tasks") == before


def test_a_plan_with_a_duplicate_id_is_rejected_naming_it_and_nothing_applied(
    shared: DaemonProc,
) -> None:
    c = shared.client()
    c.post("/tasks", {"id": "dup-old", "title": "exists"})
    before = c.get("/tasks")
    twice = {"tasks": [{"id": "dup-new", "title": "1"}, {"id": "dup-new", "title": "2"}]}
    error = error_of(raw(c).post("/plans", json=twice), 422)
    assert error["code"] == "plan_duplicate" and "dup-new" in error["message"]
    # Clashing with a task that already exists is a conflict with the current state.
    clash = {"tasks": [{"id": "dup-fresh", "title": "1"}, {"id": "dup-old", "title": "again"}]}
    error = error_of(raw(c).post("/plans", json=clash), 409)
    assert error["code"] == "task_exists" and "dup-old" in error["message"]
    error = error_of(raw(c).post("/tasks", json={"id": "dup-old", "title": "again"}), 409)
    assert "dup-old" in error["message"]
    assert c.get("/tasks") == before


def test_malformed_plans_are_refused_with_a_json_error(shared: DaemonProc) -> None:
    c = shared.client()
    before = c.get("/tasks")
    yaml_header = {"content-type": "application/yaml"}
    cases: list[tuple[dict[str, Any], int]] = [
        ({"content": b"tasks: [unclosed", "headers": yaml_header}, 400),
        ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 400),
        ({"json": {"tasks": []}}, 422),
        ({"json": {"tasks": [{"id": "no-title"}]}}, 422),
        ({"json": {"tasks": [{"title": "t", "priority": 9}]}}, 422),
        ({"json": {"tasks": [{"title": "t", "bogus": 1}]}}, 422),
        ({"content": b"", "headers": yaml_header}, 400),
    ]
    for kwargs, status in cases:
        error_of(raw(c).post("/plans", **kwargs), status)
    assert c.get("/tasks") == before


def test_a_ten_thousand_task_random_dag_plan_is_accepted_with_consistent_waves(
    repo: Path,
) -> None:
    rng = random.Random(10_000)
    ids = [f"t{i:05d}" for i in range(10_000)]
    tasks = []
    for i, tid in enumerate(ids):
        deps = rng.sample(ids[max(0, i - 500) : i], k=min(i, rng.choice([0, 1, 1, 2, 3])))
        tasks.append({"id": tid, "title": f"task {i}", "dependsOn": deps})
    rng.shuffle(tasks)  # a plan need not list dependencies first
    with core_daemon(repo) as daemon:
        c = daemon.client(timeout=120)
        started = time.monotonic()
        created = c.post("/plans", {"tasks": tasks})
        elapsed = time.monotonic() - started
        print(f"POST /plans with 10,000 tasks took {elapsed:.2f}s")
        waves = c.get("/plan")["waves"]
        assert created["waves"] == waves
        level = {tid: n for n, wave in enumerate(waves) for tid in wave}
        assert len(level) == sum(len(w) for w in waves) == 10_000
        deps_of = {t["id"]: t["dependsOn"] for t in tasks}
        for tid, deps in deps_of.items():
            assert level[tid] == 1 + max((level[d] for d in deps), default=-1), tid
        statuses = created["statuses"]
        assert {tid for tid, s in statuses.items() if s == "ready"} == {
            tid for tid, deps in deps_of.items() if not deps
        }
        listed = c.get("/tasks")
        assert len(listed) == 10_000
        assert {t["id"]: t["dependsOn"] for t in listed} == deps_of


# -- refusals: 422 for invalid values, 409 for clashes with the state -----------------------------


def test_patching_dependencies_into_a_cycle_is_refused_and_changes_nothing(
    shared: DaemonProc,
) -> None:
    c = shared.client()
    c.post(
        "/plans",
        {
            "tasks": [
                {"id": "pc-a", "title": "a"},
                {"id": "pc-b", "title": "b", "dependsOn": ["pc-a"]},
                {"id": "pc-c", "title": "c", "dependsOn": ["pc-b"]},
            ]
        },
    )
    error = error_of(raw(c).patch("/tasks/pc-a", json={"dependsOn": ["pc-c"]}), 422)
    assert error["code"] == "plan_cycle"
    assert all(tid in error["message"] for tid in ("pc-a", "pc-b", "pc-c"))
    error = error_of(raw(c).patch("/tasks/pc-a", json={"dependsOn": ["pc-ghost"]}), 422)
    assert "pc-ghost" in error["message"]
    task = c.get("/tasks/pc-a")
    assert task["dependsOn"] == [] and task["status"] == "ready"
    # A valid change moves pc-c up to the wave right after pc-a.
    patched = c.request("PATCH", "/tasks/pc-c", json={"dependsOn": ["pc-a"]})
    assert patched["dependsOn"] == ["pc-a"]
    level = {tid: n for n, wave in enumerate(c.get("/plan")["waves"]) for tid in wave}
    assert (level["pc-a"], level["pc-b"], level["pc-c"]) == (0, 1, 1)


def test_an_unknown_agent_profile_is_refused_with_422(shared: DaemonProc) -> None:
    c = shared.client()
    before = c.get("/tasks")
    error = error_of(raw(c).post("/tasks", json={"title": "t", "agent": "no-such-agent"}), 422)
    assert error["code"] == "unknown_profile"
    assert "no-such-agent" in error["message"]
    assert "custom" in error["details"]["known"]
    error = error_of(
        raw(c).post("/plans", json={"tasks": [{"title": "ok"}, {"title": "t", "agent": "nope"}]}),
        422,
    )
    assert c.get("/tasks") == before
    c.post("/tasks", {"id": "prof-ok", "title": "t", "agent": "custom"})
    error = error_of(raw(c).patch("/tasks/prof-ok", json={"agent": "nope"}), 422)
    assert error["code"] == "unknown_profile"
    assert c.get("/tasks/prof-ok")["agent"] == "custom"


def test_starting_a_task_whose_dependencies_are_not_done_is_a_409_naming_them(
    shared: DaemonProc,
) -> None:
    c = shared.client()
    c.post(
        "/plans",
        {
            "tasks": [
                {"id": "dep-one", "title": "1"},
                {"id": "dep-two", "title": "2"},
                {"id": "dep-user", "title": "u", "dependsOn": ["dep-one", "dep-two"]},
            ]
        },
    )
    error = error_of(raw(c).post("/tasks/dep-user/start"), 409)
    assert error["code"] == "dependencies_not_done"
    assert error["details"]["dependencies"] == ["dep-one", "dep-two"]
    assert "dep-one" in error["message"] and "dep-two" in error["message"]
    assert c.get("/tasks/dep-user")["status"] == "pending"


def test_approving_a_task_that_is_not_in_review_is_a_409(shared: DaemonProc) -> None:
    c = shared.client()
    c.post("/tasks", {"id": "not-reviewed", "title": "t"})
    error = error_of(raw(c).post("/tasks/not-reviewed/approve"), 409)
    assert error["code"] == "task_not_in_review"
    assert "ready" in error["message"]
    assert c.get("/tasks/not-reviewed")["status"] == "ready"


def test_unknown_tasks_and_agents_are_404s(shared: DaemonProc) -> None:
    c = shared.client()
    for method, path in (
        ("GET", "/tasks/nobody"),
        ("POST", "/tasks/nobody/start"),
        ("POST", "/tasks/nobody/stop"),
        ("POST", "/tasks/nobody/approve"),
        ("DELETE", "/tasks/nobody"),
        ("GET", "/agents/nobody"),
        ("GET", "/agents/nobody/output"),
        ("POST", "/agents/nobody/kill"),
    ):
        error_of(raw(c).request(method, path), 404)


def test_stopping_a_task_that_is_not_working_is_a_409(shared: DaemonProc) -> None:
    c = shared.client()
    c.post("/tasks", {"id": "idle", "title": "t"})
    assert error_of(raw(c).post("/tasks/idle/stop"), 409)["code"] == "task_not_working"


# -- explicit start, stop, cancel -----------------------------------------------------------------


def test_a_task_started_explicitly_runs_without_a_session(repo: Path) -> None:
    write_core_config(repo, agents={"work": {"command": agent_command("trivial.py")}})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post(
            "/tasks", [{"id": "solo", "title": "t", "agent": "work"}, {"id": "other", "title": "t"}]
        )
        assert c.get("/state")["session"]["started"] is False
        assert c.post("/tasks/solo/start")["status"] == "working"
        error = error_of(raw(c).post("/tasks/solo/start"), 409)
        assert error["code"] in ("task_working", "task_not_startable")
        task = wait_task_status(c, "solo", "review")
        assert task["changedFiles"] == ["solo.txt"]
        # Based on HEAD (there is no session, so no feature branch).
        assert task["branch"] == "grid/solo"
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        assert (
            subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "grid/solo~1"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            == head
        )
        # Nothing else ran: the other ready task waits for a session.
        assert c.get("/tasks/other")["status"] == "ready"
        spawned = event_log(c, types={"agent.spawned"})
        assert [e.data["taskId"] for e in spawned] == ["solo"]
        assert c.post("/tasks/solo/approve")["status"] == "done"


def test_stopping_a_started_task_returns_it_to_ready_and_keeps_its_work(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo, agents={"slow": {"command": agent_command("stubborn.py", str(tmp_path), "exit")}}
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "halt", "title": "t", "agent": "slow"})
        c.post("/tasks/halt/start")
        pid = int(wait_for(lambda: read_text_file(tmp_path / "halt.pid"), timeout=30))
        assert c.post("/tasks/halt/stop")["status"] == "ready"
        wait_for(lambda: process_gone(pid), timeout=20)
        wait_for_events(c, {"agent.stopped"}, 1)
        assert (tmp_path / "halt.term").exists()
        stopped = [e.data for e in event_log(c, types={"agent.stopped"})]
        assert len(stopped) == 1 and stopped[0]["committedWork"] is True
        assert scheduler_starts(c) == []  # without a session it must not restart
        task = c.get("/tasks/halt")
        assert task["status"] == "ready"
        assert c.get("/agents") == []
        shown = subprocess.run(
            ["git", "-C", str(repo), "show", "grid/halt:partial-halt.txt"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert shown == "half-done work for halt\n"


def test_cancelling_a_working_task_stops_its_agent(repo: Path, tmp_path: Path) -> None:
    write_core_config(
        repo, agents={"slow": {"command": agent_command("stubborn.py", str(tmp_path), "exit")}}
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", [{"id": "doomed", "title": "t", "agent": "slow"}])
        c.post("/tasks", {"id": "waits", "title": "needs doomed", "dependsOn": ["doomed"]})
        c.post("/session/start", {"maxAgents": 1})
        pid = int(wait_for(lambda: read_text_file(tmp_path / "doomed.pid"), timeout=30))
        assert raw(c).delete("/tasks/doomed").json()["status"] == "cancelled"
        wait_for(lambda: process_gone(pid), timeout=20)
        wait_for_events(c, {"agent.stopped"}, 1)
        assert "SIGTERM" in (tmp_path / "doomed.term").read_text()
        stopped = [e.data for e in event_log(c, types={"agent.stopped"})]
        assert [s["taskId"] for s in stopped] == ["doomed"]
        assert c.get("/tasks/doomed")["status"] == "cancelled"
        # Its dependant can never run.
        wait_task_status(c, "waits", "blocked")
        assert error_of(raw(c).delete("/tasks/doomed"), 409)["code"] == "task_finished"


def test_killing_an_agent_parks_its_task_as_blocked(repo: Path, tmp_path: Path) -> None:
    write_core_config(
        repo,
        agents={"slow": {"command": agent_command("stubborn.py", str(tmp_path), "ignore")}},
        scheduler={"stop_grace_seconds": 120},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "killme", "title": "t", "agent": "slow"})
        c.post("/session/start", {"maxAgents": 1})
        pid = int(wait_for(lambda: read_text_file(tmp_path / "killme.pid"), timeout=30))
        agent_id = c.get("/agents")[0]["id"]
        c.post(f"/agents/{agent_id}/kill")
        wait_for(lambda: process_gone(pid), timeout=20)  # SIGKILL: no grace period
        wait_for_events(c, {"agent.stopped"}, 1)
        task = c.get("/tasks/killme")
        assert task["status"] == "blocked" and "killed" in task["error"]
        assert error_of(raw(c).post(f"/agents/{agent_id}/kill"), 409)["code"] == "agent_exited"


def test_problems_in_a_posted_task_are_named_as_in_the_body_sent(shared: DaemonProc) -> None:
    c = shared.client()
    before = c.get("/tasks")
    one = error_of(raw(c).post("/tasks", json={"title": "x", "priorty": 1}), 422)
    assert one["details"]["problems"][0]["field"] == "priorty"
    assert one["message"].startswith("invalid request: priorty: ")
    listed = error_of(raw(c).post("/tasks", json=[{"title": "ok"}, {"title": "y", "pri": 1}]), 422)
    assert [p["field"] for p in listed["details"]["problems"]] == ["1.pri"]
    neither = error_of(raw(c).post("/tasks", json="just a string"), 422)
    assert neither["message"] == "invalid request: the body must be a task object or a list of them"
    empty = error_of(raw(c).post("/tasks", json=[]), 422)
    assert empty["details"]["problems"][0]["field"] == "(body)"
    assert c.get("/tasks") == before
