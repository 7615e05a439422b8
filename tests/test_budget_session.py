"""Budgets, costs, rate limits and why a session stopped, with real agents: a session never
starts what its budget cannot pay for, lets running agents finish and stops itself with the
reason; reported costs add up per task and per session; a provider's usage limit parks a
task until it resets; a session with nothing left to do stops as ``no_work``."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from tests.support.api import scheduler_starts, wait_task_status
from tests.support.daemons import core_daemon, restartable_daemon
from tests.support.repos import agent_command, touch, write_core_config
from tests.support.sse import event_log, wait_for_events
from tests.support.waits import wait_for


def beats(report_dir: Path, *actions: str, **profile: object) -> dict[str, object]:
    return {"command": agent_command("beats.py", str(report_dir), *actions), **profile}


def test_a_budget_starts_only_what_it_can_pay_for_and_stops_the_session_when_spent(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        agents={
            "paid": {
                "command": agent_command("ticker.py", str(tmp_path), "0.1"),
                "cost_per_session": 1.0,
            }
        },
        scheduler={"default_agent": "paid"},
    )
    tids = [f"b{i}" for i in range(5)]
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", [{"id": t, "title": t} for t in tids])
        session = c.post("/session/start", {"maxAgents": 5, "budgetUsd": 2.5})
        assert session["budgetUsd"] == 2.5
        wait_for(lambda: len(c.get("/agents")) == 2, message="two agents")
        assert scheduler_starts(c) == []  # the budget pays for no third start
        running = sorted(a["taskId"] for a in c.get("/agents"))
        assert len(running) == 2
        assert c.get("/state")["session"]["started"] is True  # running agents finish first
        for t in running:
            touch(tmp_path / f"{t}.go")
        for t in running:
            assert wait_task_status(c, t, "review")["costUsd"] == 1.0
        stopped = wait_for_events(c, {"session.stopped"}, 1)[0].data
        assert stopped["reason"] == "budget_exhausted"
        state = c.get("/state")
        assert state["session"]["stopReason"] == "budget_exhausted"
        assert state["session"]["started"] is False
        assert state["stats"]["spentUsd"] == 2.0
        assert sorted(t["id"] for t in c.get("/tasks", params={"status": "ready"})) == sorted(
            set(tids) - set(running)
        )
        assert len(event_log(c, types={"agent.spawned"})) == 2
        # The reason is persisted: a restarted daemon still says why the session stopped.
        grid.stop()
        grid.start()
        session = c.get("/state")["session"]
        assert (session["stopReason"], session["spentUsd"]) == ("budget_exhausted", 2.0)
        assert scheduler_starts(c) == []
        assert c.get("/agents") == []


def test_reported_costs_add_up_per_task_and_in_the_session(repo: Path, tmp_path: Path) -> None:
    write_core_config(
        repo,
        agents={
            # The agent's own figure wins over the profile's estimate.
            "thrifty": beats(
                tmp_path,
                'beat:{"status": "working", "cost_usd": 0.25}',
                'beat:{"status": "working", "cost_usd": 0.75}',
                cost_per_session=5.0,
            ),
            "estimated": beats(tmp_path, "say:no cost reported", cost_per_session=0.5),
        },
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post(
            "/tasks",
            [
                {"id": "c1", "title": "c1", "agent": "thrifty"},
                {"id": "c2", "title": "c2", "agent": "thrifty"},
                {"id": "c3", "title": "c3", "agent": "estimated"},
            ],
        )
        c.post("/session/start", {"maxAgents": 3, "budgetUsd": 20})
        costs = {t: wait_task_status(c, t, "review")["costUsd"] for t in ("c1", "c2", "c3")}
        assert costs == {"c1": 0.75, "c2": 0.75, "c3": 0.5}
        state = c.get("/state")
        assert state["stats"]["spentUsd"] == 2.0
        assert state["session"]["spentUsd"] == 2.0
        completed = {
            e.data["taskId"]: e.data["costUsd"] for e in event_log(c, types={"agent.completed"})
        }
        assert completed == costs


def test_a_rate_limited_task_is_parked_and_resumes_by_itself_after_the_reset(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        agents={
            "limited": beats(
                tmp_path,
                'once:beat:{"status": "rate_limited", "resets_at": {now+2}}',
                "once:exit:1",
                "say:resumed",
            )
        },
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "rl", "title": "hits the limit", "agent": "limited"})
        c.post("/session/start", {"maxAgents": 1})
        parked = wait_for_events(c, {"task.rate_limited"}, 1)[0].data
        assert parked["autoResume"] is True
        task = c.get("/tasks/rl")
        assert task["status"] == "rate_limited" and task["resumeAt"]
        assert c.get("/state")["session"]["started"] is True  # parked work is still work
        task = wait_task_status(c, "rl", "review", timeout=30)
        assert task["resumeAt"] is None
        spawned = event_log(c, types={"agent.spawned"})
        assert len(spawned) == 2
        assert not event_log(c, types={"agent.failed"})  # a limit is not a failure
        resumed_at = event_log(c, types={"agent.spawned"})[1]
        assert resumed_at.data["session"] == 2  # it continues the parked session's work


def test_with_auto_resume_off_a_rate_limited_task_stays_parked(repo: Path, tmp_path: Path) -> None:
    write_core_config(
        repo,
        agents={
            "limited": beats(
                tmp_path,
                'beat:{"status": "rate_limited", "resets_at": {now+1}}',
                "exit:1",
            )
        },
        scheduler={"auto_resume": False},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "rl", "title": "hits the limit", "agent": "limited"})
        c.post("/session/start", {"maxAgents": 1})
        parked = wait_for_events(c, {"task.rate_limited"}, 1)[0].data
        assert parked["autoResume"] is False
        reset = datetime.fromisoformat(c.get("/tasks/rl")["resumeAt"]).timestamp()
        wait_for(lambda: time.time() > reset + 0.2, timeout=10, message="the reset to pass")
        assert scheduler_starts(c) == []  # past the reset, it still waits for a human
        task = c.get("/tasks/rl")
        assert task["status"] == "rate_limited"
        assert len(event_log(c, types={"agent.spawned"})) == 1
        # A human resumes it.
        resumed = c.post("/tasks/rl/start")
        assert (resumed["status"], resumed["resumeAt"]) == ("working", None)
        wait_for(lambda: len(event_log(c, types={"agent.spawned"})) == 2, timeout=20)


def test_a_session_with_nothing_left_to_do_stops_as_no_work(repo: Path, tmp_path: Path) -> None:
    write_core_config(repo, agents={"quick": beats(tmp_path, "say:done")})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post(
            "/tasks",
            [
                {"id": "w1", "title": "w1", "agent": "quick"},
                {"id": "w2", "title": "w2", "agent": "quick"},
            ],
        )
        started = c.post("/session/start", {"maxAgents": 2})
        assert started["budgetUsd"] == 50.0  # the configured default
        for t in ("w1", "w2"):
            wait_task_status(c, t, "review")
        stopped = wait_for_events(c, {"session.stopped"}, 1)[0].data
        assert stopped["reason"] == "no_work"
        assert c.get("/state")["session"]["stopReason"] == "no_work"
        assert not event_log(c, types={"session.unbudgeted"})


def test_an_unbudgeted_session_must_be_asked_for_and_is_warned_about(repo: Path) -> None:
    with core_daemon(repo) as daemon:
        c = daemon.client()
        session = c.post("/session/start", {"maxAgents": 1, "budgetUsd": None})
        assert session["budgetUsd"] is None
        warning = wait_for_events(c, {"session.unbudgeted"}, 1)[0].data
        assert "no budget" in warning["warning"]
        started = event_log(c, types={"session.started"})[0].data
        assert started["budgetUsd"] is None
