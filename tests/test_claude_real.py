"""The real Claude Code CLI (pinned in tests/tools/agent-clis.txt) run by the
real daemon against a loopback stand-in of the Messages API (tests/anthropic_standin.py):
the task finishes and reaches review, questions reach a human and their answers reach the
model, follow-ups start turns, and rate limits park and resume the task at the right second.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.anthropic_standin import StandIn, Turn, error, limit, standin, tool
from tests.real_cli import (
    agent_of,
    assert_cost_counted_once,
    claude_profile,
    epoch,
    marks,
    shown_on_failure,
    spec_argv,
    start,
)
from tests.support.api import wait_pending_question, wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.repos import write_core_config
from tests.support.sse import event_log, wait_for_events

pytestmark = marks("claude")
#: How Claude Code 2.1.3xx shows the model a message sent while it works, with the next
#: tool result rather than as a turn of its own.
MID_TURN = "The user sent a new message while you were working:\n"


@pytest.fixture
def api(repo: Path) -> Iterator[StandIn]:
    with standin() as server, shown_on_failure(repo):
        yield server


def setup(
    repo: Path,
    tmp_path: Path,
    api: StandIn,
    *,
    scheduler: dict[str, object] | None = None,
    **kw: Any,
) -> None:
    write_core_config(
        repo,
        agents={"claude": claude_profile(api.url, tmp_path / "home", **kw)},
        scheduler={"default_agent": "claude", **(scheduler or {})},
    )


def test_a_write_approved_by_a_question_ends_in_review_with_the_file_committed(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    worktree = repo / ".grid" / "worktrees" / "write"
    api.push(tool("Write", {"file_path": str(worktree / "hello.txt"), "content": "hello\n"}))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "write")
        question = wait_pending_question(c, "write", timeout=60)
        assert question["type"] == "permission"
        assert str(question["question"]).startswith("Allow Write: ")
        c.post(f"/questions/{question['id']}/answer", {"response": "allow"})
        task = wait_task_status(c, "write", "review", timeout=60)
        assert task["changedFiles"] == ["hello.txt"]
        assert git_show(repo, "grid/write:hello.txt") == "hello\n"
        agent = agent_of(c, "write")
        assert agent["status"] == "exited" and agent["exitCode"] == 0
        assert agent["model"]
        assert agent["sessionId"]
        assert agent["inputTokens"] and agent["outputTokens"]
        # Cost counted once: the agent's, the task's and the session's are the same.
        assert agent["costUsd"] > 0
        assert_cost_counted_once(c, "write", agent["costUsd"])
        # The model saw the write succeed.
        [result] = api.tool_results()
        assert "created successfully" in str(result["content"])


def test_an_ask_user_question_answer_reaches_the_model_as_its_tool_result(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    questions = [
        {
            "question": "Which color?",
            "header": "Color",
            "multiSelect": False,
            "options": [
                {"label": "red", "description": "warm"},
                {"label": "blue", "description": "cool"},
            ],
        }
    ]
    api.push(tool("AskUserQuestion", {"questions": questions}))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "ask")
        question = wait_pending_question(c, "ask", timeout=60)
        assert question["question"] == "Which color?"
        assert question["options"] == ["red", "blue"]
        c.post(f"/agents/{question['agentId']}/respond", {"response": "blue"})
        wait_task_status(c, "ask", "review", timeout=60)
        [result] = api.tool_results()
        assert "blue" in str(result["content"]) and "Which color?" in str(result["content"])


@pytest.mark.parametrize("how", ["allowed-by-policy", "denied-by-human"])
def test_bash_allowed_by_the_profile_runs_and_bash_denied_by_a_human_does_not(
    repo: Path, tmp_path: Path, api: StandIn, how: str
) -> None:
    allowed = how == "allowed-by-policy"
    setup(repo, tmp_path, api, **({"allowed_tools": ["Bash"]} if allowed else {}))
    api.push(tool("Bash", {"command": "echo ran > bash.txt", "description": "write bash.txt"}))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "bash")
        if not allowed:
            question = wait_pending_question(c, "bash", timeout=60)
            assert str(question["question"]).startswith("Allow Bash: echo ran > bash.txt")
            c.post(f"/questions/{question['id']}/answer", {"response": "deny"})
        task = wait_task_status(c, "bash", "review", timeout=60)
        [result] = api.tool_results()
        if allowed:
            assert not c.get("/questions", params={"all": "1"})
            assert task["changedFiles"] == ["bash.txt"]
            assert git_show(repo, "grid/bash:bash.txt") == "ran\n"
        else:
            assert result.get("is_error") is True
            assert task["changedFiles"] == []


def test_a_follow_up_sent_while_claude_works_becomes_part_of_the_conversation(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    gate = threading.Event()
    api.push(Turn(text="working on it", gate=gate))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "follow")
        api.wait_turns(1, timeout=60)  # claude is waiting for the model's answer
        agent_id = agent_of(c, "follow")["id"]
        reply = c.post(f"/agents/{agent_id}/respond", {"response": "also mention the tests"})
        assert reply == {"status": "delivered"}  # a follow-up, not an answer
        gate.set()
        wait_task_status(c, "follow", "review", timeout=60)
        texts = [t for r in api.turns() for t in api.user_texts(r)]
        assert any("also mention the tests" in t for t in texts)
        assert len(event_log(c, types={"agent.responded"})) == 1
        # Every byte gridd wrote to claude's stdin was stream-json it accepted.
        assert agent_of(c, "follow")["exitCode"] == 0


def test_an_error_result_fails_the_task_with_the_result_as_context(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    refusal = "the stand-in refuses this request"
    api.push(error(400, kind="invalid_request_error", message=refusal, persists=True))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "bad", prompt="go", maxAttempts=1)
        task = wait_task_status(c, "bad", "failed", timeout=60)
        assert "the stand-in refuses this request" in str(task["error"])
        [failed] = event_log(c, types={"agent.failed"})
        failure = Path(str(failed.data["failureFile"])).read_text()
        assert "the stand-in refuses this request" in failure


def test_an_api_retry_is_shown_and_is_not_a_stall(repo: Path, tmp_path: Path, api: StandIn) -> None:
    setup(repo, tmp_path, api, retries=2)
    config = (repo / ".grid" / "config.toml").read_text()
    (repo / ".grid" / "config.toml").write_text(config + "stall_seconds = 1.5\n")
    api.push(error(529, headers={"retry-after": "3"}))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "retry")
        [retrying] = wait_for_events(c, {"agent.retrying"}, 1, timeout=60)
        assert retrying.data["attempt"] == 1
        assert retrying.data["status"] == 529
        assert retrying.data["delaySeconds"] > 0
        wait_task_status(c, "retry", "review", timeout=60)
        assert not event_log(c, types={"agent.stalled"})


@pytest.mark.parametrize(
    "kind", ["five_hour", "seven_day", "seven_day_opus", "seven_day_sonnet", "api_key"]
)
def test_a_rate_limit_parks_the_task_until_its_reset_and_resumes_the_session(
    repo: Path, tmp_path: Path, api: StandIn, kind: str
) -> None:
    api_key = kind == "api_key"
    setup(repo, tmp_path, api, oauth=not api_key, retries=1 if api_key else 0)
    if api_key:  # the CLI retries once after retry-after, then gives up
        api.push(*[error(429, headers={"retry-after": "3"})] * 2)
    else:
        api.push(limit(kind, reset_in=4))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "limited")
        parked = wait_task_status(c, "limited", "rate_limited", timeout=60)
        [event] = wait_for_events(c, {"agent.rate_limited"}, 1, timeout=10)
        first = agent_of(c, "limited")
        reset = float(event.data["resetsAt"])
        if api_key:
            assert event.data["limitType"] == "api_key"
            assert event.data["source"] == "retry-after"
        else:
            assert event.data["limitType"] == kind
            assert event.data["source"] == "rate_limit_event"
            assert [reset] == api.resets  # the exact second the API named
        # Parked until exactly the reset plus the one-second margin.
        assert epoch(str(parked["resumeAt"])) == pytest.approx(reset + 1, abs=0.01)
        task = wait_task_status(c, "limited", "review", timeout=60)
        second = agent_of(c, "limited")
        assert second["id"] != first["id"]
        started = epoch(second["startedAt"])
        # Resumed after that, never early (the scheduler wakes for it; the bound above is
        # loose only for a loaded machine).
        assert reset + 1 <= started < reset + 1 + 15
        argv = spec_argv(second)
        assert argv[argv.index("--resume") + 1] == first["sessionId"]
        prompt = " ".join(api.user_texts(api.turns()[-1]))
        assert "interrupted by a rate limit" in prompt
        # One event per park, and the task finished.
        assert len(event_log(c, types={"agent.rate_limited"})) == 1
        assert task["status"] == "review"


def test_a_question_pending_across_a_daemon_kill_is_answered_after_the_restart(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    worktree = repo / ".grid" / "worktrees" / "crash"
    api.push(tool("Write", {"file_path": str(worktree / "kept.txt"), "content": "kept\n"}))
    with core_daemon(repo) as first:
        c = first.client()
        start(c, "crash")
        question = wait_pending_question(c, "crash", timeout=60)
        first.kill9()
        with core_daemon(repo) as second:
            c2 = second.client()
            assert [q["id"] for q in c2.get("/questions")] == [question["id"]]
            c2.post(f"/questions/{question['id']}/answer", {"response": "allow"})
            wait_task_status(c2, "crash", "review", timeout=60)
            assert git_show(repo, "grid/crash:kept.txt") == "kept\n"
            agent = agent_of(c2, "crash")
            assert agent["costUsd"] > 0
            assert_cost_counted_once(c2, "crash", agent["costUsd"])


def test_a_silent_claude_is_nudged_with_continue_before_any_stall_kill(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api, scheduler={"stall_kill_seconds": 60})
    config = (repo / ".grid" / "config.toml").read_text()
    (repo / ".grid" / "config.toml").write_text(config + "stall_seconds = 2\n")
    gate = threading.Event()
    api.push(Turn(text="thinking for a long time", gate=gate))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "nudge")
        [stalled] = wait_for_events(c, {"agent.stalled"}, 1, timeout=60)
        [nudged] = wait_for_events(c, {"agent.nudged"}, 1, timeout=10)
        assert nudged.data["text"] == "continue" and nudged.data["reason"] == "a stall"
        assert nudged.id is not None and stalled.id is not None and nudged.id > stalled.id
        gate.set()
        wait_task_status(c, "nudge", "review", timeout=60)
        texts = [t for r in api.turns() for t in api.user_texts(r)]
        assert "continue" in texts or any("continue" in t for t in texts[1:])
        assert agent_of(c, "nudge")["stopReason"] is None


def test_a_continue_heartbeat_mid_turn_leads_claude_to_a_further_model_turn(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api, allowed_tools=["Bash"])
    gate = threading.Event()
    beat = json.dumps({"status": "continue", "message": "half done"})
    command = f"echo '{beat}' >> \"$GRID_HEARTBEAT\""
    api.push(
        tool("Bash", {"command": command, "description": "say half done"}),
        Turn(text="Half way there.", gate=gate),
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "beat")
        [nudged] = wait_for_events(c, {"agent.nudged"}, 1, timeout=60)
        assert nudged.data["reason"] == "a continue heartbeat"
        assert nudged.data["text"] == "continue"
        gate.set()  # the turn the heartbeat came in ends
        wait_task_status(c, "beat", "review", timeout=60)
        # The model was shown the nudge after the heartbeat was written: as a turn of its
        # own, or (2.1.3xx, when it comes before the CLI's next request) inside the running
        # turn, with the next tool result.
        turns = api.turns()
        assert "continue" not in api.user_texts(turns[0])
        later = [text for turn in turns[1:] for text in api.user_texts(turn)]
        assert "continue" in later or any(MID_TURN + "continue\n" in text for text in later)
        agent = agent_of(c, "beat")
        assert agent["exitCode"] == 0 and agent["stopReason"] is None
