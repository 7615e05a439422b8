"""Step mode: with ``[scheduler] step_mode = true`` nothing reconciles by itself, and each
``POST /scheduler/step`` runs exactly one pass and answers with what it did, after the
starts it launched have run. Tests drive the scheduler this way instead of sleeping."""

from __future__ import annotations

from pathlib import Path

from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon
from tests.support.repos import agent_command, touch, write_core_config
from tests.support.sse import event_log


def test_in_step_mode_only_a_step_starts_work_and_it_answers_with_what_it_did(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        # Each agent runs until told to finish (CONTROL/<task>.go): no slot frees by itself.
        agents={"work": {"command": agent_command("ticker.py", str(tmp_path), "0.2")}},
        scheduler={"default_agent": "work", "step_mode": True},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", [{"id": "s1", "title": "first"}, {"id": "s2", "title": "second"}])
        c.post("/session/start", {"maxAgents": 1})
        # No loop runs: the ready tasks wait for a step, however many ticks pass.
        assert {t["status"] for t in c.get("/tasks")} == {"ready"}

        first = c.post("/scheduler/step")
        starts = [a for a in first["actions"] if a["action"] == "start"]
        assert starts == [{"action": "start", "taskId": "s1", "profile": "work"}] or starts == [
            {"action": "start", "taskId": "s2", "profile": "work"}
        ]
        started = starts[0]["taskId"]
        # The answer comes after the start ran: the agent is spawned already.
        spawned = [e.data["taskId"] for e in event_log(c, types={"agent.spawned"})]
        assert spawned == [started]
        assert [a["taskId"] for a in c.get("/agents")] == [started]

        # One slot, taken: asked again, the scheduler starts nothing.
        again = c.post("/scheduler/step")
        assert [a for a in again["actions"] if a["action"] == "start"] == []
        assert again["passes"] == first["passes"] + 1

        touch(tmp_path / f"{started}.go")
        wait_task_status(c, started, "review")
        other = "s2" if started == "s1" else "s1"
        assert c.get(f"/tasks/{other}")["status"] == "ready"  # still waiting for a step
        after = c.post("/scheduler/step")
        assert [a["taskId"] for a in after["actions"] if a["action"] == "start"] == [other]
        touch(tmp_path / f"{other}.go")
        wait_task_status(c, other, "review")


def test_a_step_reports_the_stop_of_a_task_cancelled_while_its_agent_runs(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        agents={"slow": {"command": agent_command("trivial.py", "30")}},
        scheduler={"default_agent": "slow", "step_mode": True},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "long", "title": "runs long"})
        c.post("/session/start", {"maxAgents": 1})
        assert [a["action"] for a in c.post("/scheduler/step")["actions"]] == ["start"]
        agent = c.get("/agents")[0]
        c.request("DELETE", "/tasks/long")
        stops = [a for a in c.post("/scheduler/step")["actions"] if a["action"] == "stop"]
        assert len(stops) == 1
        assert (stops[0]["agentId"], stops[0]["taskId"]) == (agent["id"], "long")


async def test_a_stopping_daemon_starts_no_agent_after_daemon_stopping(repo: Path) -> None:
    from typing import cast

    import httpx

    from gridd.grid import Grid
    from tests.support.daemons import inprocess_daemon

    config = {
        "agents": {"work": {"command": ["sh", "-c", "sleep 30"]}},
        "scheduler": {"default_agent": "work", "step_mode": True},
    }
    async with inprocess_daemon(repo, config) as daemon:
        grid = cast(Grid, daemon.grid)
        transport = httpx.AsyncHTTPTransport(uds=str(daemon.sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://gridd") as c:
            assert (await c.post("/tasks", json={"id": "late", "title": "late"})).is_success
            assert (await c.post("/session/start", json={"maxAgents": 1})).is_success
        # SIGTERM (or POST /shutdown) arrives with a ready task and a free slot: the
        # daemon winds down, and its scheduler starts nothing in the meantime.
        grid.request_shutdown()
        assert await grid.scheduler.step() == []
        assert grid.state.tasks["late"].status == "ready"
        assert not grid.state.agents
