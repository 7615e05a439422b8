"""The fake ``claude`` (tests/fakes/claude, stream-json both ways) driven through the real
daemon: a permission request over the control protocol and an AskUserQuestion become gridd
questions, the answers go back in the form the protocol expects, the agent completes, and its
cost and session id are recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gridd.client import GridClient
from tests.support.api import wait_pending_question, wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.repos import fake_claude_profile, write_core_config
from tests.support.sse import event_log, wait_for_events

COST = 0.0123  # what the fake reports as total_cost_usd


def stdin_lines(log: Path) -> list[dict[str, Any]]:
    """Every JSON line gridd wrote to the fake's stdin ($FAKE_CLAUDE_LOG)."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def init_session_id(c: GridClient, agent_id: str) -> str:
    """The session id the fake announced in its ``system/init`` line."""
    text = "".join(chunk["chunk"] for chunk in c.get(f"/agents/{agent_id}/output")["chunks"])
    init = json.loads(text.splitlines()[0])
    assert init["type"] == "system" and init["subtype"] == "init"
    return str(init["session_id"])


def assert_cost_and_session(c: GridClient, task_id: str, agent_id: str) -> None:
    agent = c.get(f"/agents/{agent_id}")
    assert agent["status"] == "exited"
    assert agent["costUsd"] == pytest.approx(COST)
    assert agent["sessionId"] == init_session_id(c, agent_id)
    assert c.get(f"/tasks/{task_id}")["costUsd"] == pytest.approx(COST)
    [completed] = event_log(c, types={"agent.completed"})
    assert completed.data["costUsd"] == pytest.approx(COST)


def setup(repo: Path, log: Path, *, stdio: bool = True) -> None:
    profile = fake_claude_profile(stdio=stdio, env={"FAKE_CLAUDE_LOG": str(log)})
    write_core_config(
        repo, agents={"fakeclaude": profile}, scheduler={"default_agent": "fakeclaude"}
    )


def start(c: GridClient, task_id: str, prompt: str) -> None:
    c.post("/tasks", {"id": task_id, "title": task_id, "prompt": prompt})
    c.post("/session/start", {"featureBranch": "feature/claude"})


@pytest.mark.parametrize("decision", ["allow", "deny"])
def test_a_claude_permission_request_is_answered_over_the_control_protocol(
    repo: Path, tmp_path: Path, decision: str
) -> None:
    log = tmp_path / "stdin.log"
    setup(repo, log)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "perm", "scenario:permission write permitted.txt")
        question = wait_pending_question(c, "perm")
        assert question["type"] == "permission"
        assert question["options"] == ["allow", "deny"]
        assert str(question["question"]).startswith("Allow Write: ")
        assert str(question["question"]).endswith("permitted.txt?")
        agent_id = str(question["agentId"])
        assert c.get(f"/agents/{agent_id}")["status"] == "waiting"
        assert c.get("/tasks/perm")["waitingSince"]

        answered = c.post(f"/questions/{question['id']}/answer", {"response": decision})
        assert answered["status"] == "answered"
        task = wait_task_status(c, "perm", "review")
        assert task["waitingSince"] is None

        # The answer went back as the control_response the request waits for.
        [prompt, reply] = stdin_lines(log)
        assert prompt["type"] == "user"
        assert reply["type"] == "control_response"
        response = reply["response"]
        assert response["subtype"] == "success"
        assert response["request_id"] == question["key"]
        assert response["response"]["behavior"] == decision
        if decision == "allow":
            assert task["changedFiles"] == ["permitted.txt"]
            assert git_show(repo, "grid/perm:permitted.txt") == "permitted\n"
            assert c.get(f"/agents/{agent_id}")["result"] == "Wrote permitted.txt"
        else:
            assert task["changedFiles"] == []
            assert git_show(repo, "grid/perm:permitted.txt") is None
            assert "denied" in c.get(f"/agents/{agent_id}")["result"]
        assert_cost_and_session(c, "perm", agent_id)


@pytest.mark.parametrize(
    ("stdio", "response"),
    [(True, "blue"), (False, "red"), (True, "teal, please")],
    ids=["control-protocol", "tool-result", "free-text"],
)
def test_a_claude_ask_user_question_is_answered_and_the_agent_uses_the_answer(
    repo: Path, tmp_path: Path, stdio: bool, response: str
) -> None:
    log = tmp_path / "stdin.log"
    setup(repo, log, stdio=stdio)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "color", "scenario:ask pick a color")
        question = wait_pending_question(c, "color")
        assert question["question"] == "Which color should answer.txt hold?"
        assert question["options"] == ["red", "blue"]
        assert question["type"] == "decision"
        [asked] = wait_for_events(c, {"agent.question"}, 1)
        assert asked.data["questionId"] == question["id"]
        assert asked.data["options"] == ["red", "blue"]

        # covend's path works for Claude too: it answers the oldest open question.
        reply = c.post(f"/agents/{question['agentId']}/respond", {"response": response})
        assert reply["question"]["answer"] == response
        wait_task_status(c, "color", "review")
        assert git_show(repo, "grid/color:answer.txt") == response + "\n"

        sent = stdin_lines(log)[1]
        if stdio:
            assert sent["type"] == "control_response"
            decision = sent["response"]["response"]
            assert decision["behavior"] == "allow"
            assert decision["updatedInput"]["answers"] == {question["question"]: response}
        else:
            [block] = sent["message"]["content"]
            assert block["type"] == "tool_result"
            assert block["content"] == response
        assert_cost_and_session(c, "color", str(question["agentId"]))


def test_a_claude_permission_asked_before_a_daemon_crash_is_answered_after_it(
    repo: Path, tmp_path: Path
) -> None:
    log = tmp_path / "stdin.log"
    setup(repo, log)
    with core_daemon(repo) as first:
        c = first.client()
        start(c, "crash", "scenario:permission write permitted.txt")
        question = wait_pending_question(c, "crash")
        first.kill9()
        with core_daemon(repo) as second:
            c2 = second.client()
            assert [q["id"] for q in c2.get("/questions")] == [question["id"]]
            c2.post(f"/questions/{question['id']}/answer", {"response": "allow"})
            wait_task_status(c2, "crash", "review")
            assert git_show(repo, "grid/crash:permitted.txt") == "permitted\n"
            assert len(c2.get("/questions", params={"all": "1"})) == 1
            agent = c2.get(f"/agents/{question['agentId']}")
            assert agent["costUsd"] == pytest.approx(COST)
            assert agent["sessionId"] == init_session_id(c2, str(question["agentId"]))
