"""The real opencode CLI (pinned in tests/tools/agent-clis.txt) run by the
real daemon against a loopback Anthropic Messages API stand-in (tests/anthropic_standin.py,
opencode's bundled ``anthropic`` provider with its ``baseURL`` in the config): a task's file
write reaches review with opencode's own cost, a command's output reaches the model, an
error fails the task with its message, and a run outlives a daemon killed with SIGKILL.

opencode takes its directory from ``$PWD``: the profile passes ``--dir {worktree}``, and
these tests check that the write lands in the task's worktree, not in the repository.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.anthropic_standin import StandIn, Turn, error, limit, standin, tool
from tests.real_cli import (
    AFTER_RESTART,
    agent_of,
    assert_cost_counted_once,
    epoch,
    killed_mid_run,
    marks,
    opencode_profile,
    shown_on_failure,
    spec_argv,
    start,
)
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.repos import write_core_config
from tests.support.sse import event_log, wait_for_events

pytestmark = marks("opencode")


@pytest.fixture
def api(repo: Path) -> Iterator[StandIn]:
    with standin() as server, shown_on_failure(repo):
        yield server


def setup(repo: Path, tmp_path: Path, api: StandIn) -> None:
    profile = opencode_profile(api.url, tmp_path / "home")
    write_core_config(repo, agents={"opencode": profile}, scheduler={"default_agent": "opencode"})


def test_a_file_written_by_opencode_lands_in_its_worktree_and_reaches_review_with_its_cost(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    worktree = repo / ".grid" / "worktrees" / "write"
    api.push(tool("write", {"filePath": str(worktree / "hello.txt"), "content": "hello\n"}))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "write")
        task = wait_task_status(c, "write", "review", timeout=120)
        assert task["changedFiles"] == ["hello.txt"]
        assert git_show(repo, "grid/write:hello.txt") == "hello\n"
        assert not (repo / "hello.txt").exists()
        agent = agent_of(c, "write")
        argv = spec_argv(agent)
        assert argv[argv.index("--dir") + 1] == str(worktree)
        assert agent["sessionId"] and str(agent["sessionId"]).startswith("ses_")
        assert agent["result"] == "Done."
        # Two steps of 25 in and 12 out, priced by opencode itself (its catalogue's
        # claude-sonnet-4-5: $3 and $15 per million).
        assert (agent["inputTokens"], agent["outputTokens"]) == (50, 24)
        expected = 2 * (25 * 3 + 12 * 15) / 1_000_000
        assert_cost_counted_once(c, "write", expected)


def test_a_command_opencode_runs_gives_its_output_to_the_model(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    api.push(
        tool(
            "bash",
            {
                "command": "echo ran-by-opencode > ran.txt && cat ran.txt",
                "description": "write ran.txt",
            },
        )
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "bash")
        task = wait_task_status(c, "bash", "review", timeout=120)
        [result] = api.tool_results()
        assert "ran-by-opencode" in str(result["content"])
        assert task["changedFiles"] == ["ran.txt"]
        assert agent_of(c, "bash")["currentTool"] is None


def test_an_error_fails_the_task_with_the_api_message_as_context(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    api.push(error(400, kind="invalid_request_error", message="the stand-in refuses this request"))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "bad", maxAttempts=1)
        task = wait_task_status(c, "bad", "failed", timeout=120)
        assert "APIError: the stand-in refuses this request" in str(task["error"])
        [failed] = event_log(c, types={"agent.failed"})
        failure = Path(str(failed.data["failureFile"])).read_text()
        assert "the stand-in refuses this request" in failure


def test_a_daemon_killed_mid_run_reattaches_opencode_and_loses_none_of_its_output(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    worktree = repo / ".grid" / "worktrees" / "crash"
    gate = threading.Event()
    api.push(
        tool("write", {"filePath": str(worktree / "kept.txt"), "content": "kept\n"}),
        Turn(text=AFTER_RESTART, gate=gate),
    )
    with killed_mid_run(repo, api, gate=gate, timeout=120) as (c2, agent):
        # Both steps counted once: tokens and opencode's own cost.
        assert (agent["inputTokens"], agent["outputTokens"]) == (50, 24)
        expected = 2 * (25 * 3 + 12 * 15) / 1_000_000
        assert_cost_counted_once(c2, "crash", expected)


def test_a_rate_limit_opencode_gives_up_on_parks_the_task_to_its_reset_and_resumes_the_session(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    setup(repo, tmp_path, api)
    # Every request gets the 429 until the reset: opencode retries it five times by itself
    # (retry-after-ms apart), then gives up with an error event carrying the headers.
    api.push(limit("five_hour", reset_in=6, headers={"retry-after-ms": "100"}))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "limited")
        parked = wait_task_status(c, "limited", "rate_limited", timeout=120)
        [event] = wait_for_events(c, {"agent.rate_limited"}, 1, timeout=10)
        first = agent_of(c, "limited")
        [reset] = api.resets
        assert len(api.turns()) == 6  # the first request and opencode's five retries
        assert event.data["source"] == "anthropic-ratelimit-unified-reset"
        assert float(event.data["resetsAt"]) == reset  # the exact second the API named
        assert epoch(str(parked["resumeAt"])) == pytest.approx(reset + 1, abs=0.01)
        task = wait_task_status(c, "limited", "review", timeout=120)
        second = agent_of(c, "limited")
        assert second["id"] != first["id"]
        assert epoch(second["startedAt"]) >= reset + 1  # never early
        argv = spec_argv(second)
        assert argv[argv.index("--session") + 1] == first["sessionId"]
        assert second["sessionId"] == first["sessionId"]
        texts = api.user_texts()
        # The first prompt is still the conversation's first message (opencode quotes it).
        assert "do the task" in texts[0] and "rate limit" not in texts[0]
        assert "interrupted by a rate limit" in texts[-1]
        assert len(event_log(c, types={"agent.rate_limited"})) == 1
        assert task["status"] == "review"
