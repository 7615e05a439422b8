"""The real Gemini CLI (pinned in tests/tools/agent-clis.txt) run by the real
daemon against a loopback stand-in of the Gemini API (tests/gemini_standin.py): a task's
file write reaches review with its cost, a command's output reaches the model while gridd
shows the command, an error fails the task with its message, and a quota error with a
retry delay parks the task to it and resumes the same gemini session, and a run outlives a
daemon killed with SIGKILL.

The CLI needs ``selectedType = "gemini-api-key"`` in its settings.json (else exit 41) and a
trusted folder (the profile's ``--skip-trust``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.adapters.prices import PRICES
from tests.gemini_standin import MODEL, StandIn, Turn, call, error, quota, standin
from tests.real_cli import (
    AFTER_RESTART,
    agent_of,
    assert_cost_counted_once,
    epoch,
    gemini_profile,
    killed_mid_run,
    marks,
    shown_on_failure,
    spec_argv,
    start,
)
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.repos import write_core_config
from tests.support.sse import event_log, wait_for_events
from tests.support.waits import wait_for

pytestmark = marks("gemini")


@pytest.fixture
def api(repo: Path) -> Iterator[StandIn]:
    with standin() as server, shown_on_failure(repo):
        yield server


def setup(repo: Path, tmp_path: Path, api: StandIn) -> None:
    profile = gemini_profile(api.url, tmp_path / "home", MODEL)
    write_core_config(repo, agents={"gemini": profile}, scheduler={"default_agent": "gemini"})


def test_a_file_written_by_gemini_reaches_review_with_its_cost_counted_once(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    worktree = repo / ".grid" / "worktrees" / "write"
    api.push(call("write_file", {"file_path": str(worktree / "hello.txt"), "content": "hello\n"}))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "write")
        task = wait_task_status(c, "write", "review", timeout=90)
        assert task["changedFiles"] == ["hello.txt"]
        assert git_show(repo, "grid/write:hello.txt") == "hello\n"
        agent = agent_of(c, "write")
        assert agent["status"] == "exited" and agent["exitCode"] == 0
        assert agent["model"] == MODEL and agent["sessionId"]
        assert agent["result"] == "Done."
        # Two model calls (the write, then its answer) of 1000 in and 50 out each.
        assert (agent["inputTokens"], agent["outputTokens"]) == (2000, 100)
        price = PRICES["gemini-2.5-pro"]
        expected = (2000 * price.input + 100 * price.output) / 1_000_000
        assert_cost_counted_once(c, "write", expected)


def test_a_command_gemini_runs_is_shown_as_its_tool_and_its_output_reaches_the_model(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    command = "while [ ! -e go ]; do sleep 0.05; done; echo shell-ran-here"
    api.push(call("run_shell_command", {"command": command}))
    worktree = repo / ".grid" / "worktrees" / "tool"
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "tool")
        tool = wait_for(
            lambda: agent_of(c, "tool")["currentTool"] if c.get("/agents") else None,
            timeout=90,
            message="gemini never showed its command",
        )
        assert tool == f"run_shell_command: {command}"
        (worktree / "go").write_text("")
        wait_task_status(c, "tool", "review", timeout=60)
        [response] = api.function_responses()
        assert "shell-ran-here" in json.dumps(response)
        assert agent_of(c, "tool")["currentTool"] is None


def test_an_error_result_fails_the_task_with_the_api_message_as_context(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    api.push(error(400, message="the stand-in refuses this request"))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "bad", maxAttempts=1)
        task = wait_task_status(c, "bad", "failed", timeout=90)
        assert "the stand-in refuses this request" in str(task["error"])
        [failed] = event_log(c, types={"agent.failed"})
        failure = Path(str(failed.data["failureFile"])).read_text()
        assert "the stand-in refuses this request" in failure


def test_a_quota_error_is_parked_to_its_retry_delay_and_resumes_the_same_session(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    # The first call works (a command runs), the second hits a quota with a delay too long
    # for the CLI to wait itself (over 300 s): it gives up with exit 173.
    api.push(
        call("run_shell_command", {"command": "echo first > first.txt"}),
        quota(per="Minute", retry_delay="400s"),
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "limited")
        parked = wait_task_status(c, "limited", "rate_limited", timeout=90)
        [event] = wait_for_events(c, {"agent.rate_limited"}, 1, timeout=10)
        first = agent_of(c, "limited")
        assert first["sessionId"]
        assert event.data["source"] == "retry-after" and event.data["limitType"] == "quota"
        output = (Path(first["runDir"]) / "output.log").read_text().splitlines()
        [result] = [json.loads(line) for line in output if line.startswith('{"type":"result"')]
        said = epoch(result["timestamp"])  # the CLI's own time of its result
        assert float(event.data["resetsAt"]) == pytest.approx(said + 400)
        assert epoch(str(parked["resumeAt"])) == pytest.approx(said + 401, abs=0.01)
        # Four hundred seconds is too long to wait here: a human resumes it by hand.
        c.post("/tasks/limited/start", {})
        wait_task_status(c, "limited", "review", timeout=90)
        second = agent_of(c, "limited")
        assert second["id"] != first["id"]
        argv = spec_argv(second)
        assert argv[argv.index("--resume") + 1] == first["sessionId"]
        assert second["sessionId"] == first["sessionId"]
        assert "do the task" in api.user_texts()  # the first prompt is still in the session
        assert git_show(repo, "grid/limited:first.txt") == "first\n"


def test_a_daemon_killed_mid_run_reattaches_gemini_and_loses_none_of_its_output(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    worktree = repo / ".grid" / "worktrees" / "crash"
    gate = threading.Event()
    api.push(
        call("write_file", {"file_path": str(worktree / "kept.txt"), "content": "kept\n"}),
        Turn(text=AFTER_RESTART, gate=gate),
    )
    with killed_mid_run(repo, api, gate=gate, timeout=90) as (c2, agent):
        assert (agent["inputTokens"], agent["outputTokens"]) == (2000, 100)
        price = PRICES["gemini-2.5-pro"]
        expected = (2000 * price.input + 100 * price.output) / 1_000_000
        assert_cost_counted_once(c2, "crash", expected)
