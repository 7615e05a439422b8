"""The real Codex CLI (pinned in tests/tools/agent-clis.txt) run by the real
daemon against a loopback stand-in of the OpenAI Responses API (tests/openai_standin.py): a
task's file write reaches review with its cost, a command's output reaches the model while
gridd shows the command, an error fails the task with its message, and a usage limit parks
the task to its reset and resumes the same codex session.

Codex reads its provider from ``$CODEX_HOME/config.toml`` (it ignores ``OPENAI_BASE_URL``),
and its sandbox fails when ``CODEX_HOME`` is under the temporary directory: each test's home
is under ``.cache/`` (``tests/real_cli.py``'s ``codex_home``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from gridd.adapters.prices import PRICES
from tests.openai_standin import MODEL, StandIn, Turn, call, error, standin, usage_limit
from tests.real_cli import (
    AFTER_RESTART,
    agent_of,
    assert_cost_counted_once,
    codex_profile,
    epoch,
    killed_mid_run,
    marks,
    shown_on_failure,
    spec_argv,
    start,
)
from tests.real_cli import codex_home as make_codex_home
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.repos import write_core_config
from tests.support.sse import event_log, wait_for_events
from tests.support.waits import wait_for

pytestmark = marks("codex")


@pytest.fixture
def api(repo: Path) -> Iterator[StandIn]:
    with standin() as server, shown_on_failure(repo):
        yield server


@pytest.fixture
def codex_home(api: StandIn) -> Iterator[Path]:
    with make_codex_home(api.url, MODEL) as home:
        yield home


def setup(repo: Path, home: Path) -> None:
    write_core_config(
        repo, agents={"codex": codex_profile(home, MODEL)}, scheduler={"default_agent": "codex"}
    )


def outputs(api: StandIn) -> list[str]:
    """What each command codex ran gave back to the model."""
    return [str(item.get("output")) for item in api.inputs("function_call_output")]


def test_a_file_written_by_codex_reaches_review_with_its_cost_counted_once(
    repo: Path, codex_home: Path, api: StandIn
) -> None:
    setup(repo, codex_home)
    api.push(call("exec_command", {"cmd": "printf 'hello\\n' > hello.txt"}))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "write")
        task = wait_task_status(c, "write", "review", timeout=60)
        assert task["changedFiles"] == ["hello.txt"]
        assert git_show(repo, "grid/write:hello.txt") == "hello\n"
        agent = agent_of(c, "write")
        assert agent["status"] == "exited" and agent["exitCode"] == 0
        assert agent["model"] == MODEL
        assert agent["sessionId"]
        assert agent["result"] == "Done."
        # Two model calls (the command, then its answer) of 1200 in and 80 out each.
        assert (agent["inputTokens"], agent["outputTokens"]) == (2400, 160)
        price = PRICES["gpt-5-codex"]
        expected = (2400 * price.input + 160 * price.output) / 1_000_000
        assert_cost_counted_once(c, "write", expected)


def test_a_command_codex_runs_is_shown_as_its_tool_and_its_output_reaches_the_model(
    repo: Path, codex_home: Path, api: StandIn
) -> None:
    setup(repo, codex_home)
    command = "while [ ! -e go ]; do sleep 0.05; done; echo six-times-seven=$((6*7))"
    api.push(call("exec_command", {"cmd": command, "yield_time_ms": 30000}))
    worktree = repo / ".grid" / "worktrees" / "tool"
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "tool")
        tool = wait_for(
            lambda: agent_of(c, "tool")["currentTool"] if c.get("/agents") else None,
            timeout=60,
            message="codex never showed its command",
        )
        assert tool.startswith("shell: ") and "six-times-seven" in tool
        (worktree / "go").write_text("")
        wait_task_status(c, "tool", "review", timeout=60)
        assert any("six-times-seven=42" in out for out in outputs(api))
        assert agent_of(c, "tool")["currentTool"] is None


def test_an_error_turn_fails_the_task_with_the_api_message_as_context(
    repo: Path, codex_home: Path, api: StandIn
) -> None:
    setup(repo, codex_home)
    api.push(error(400, message="the stand-in refuses this request"))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "bad", maxAttempts=1)
        task = wait_task_status(c, "bad", "failed", timeout=60)
        assert "the stand-in refuses this request" in str(task["error"])
        [failed] = event_log(c, types={"agent.failed"})
        failure = Path(str(failed.data["failureFile"])).read_text()
        assert "the stand-in refuses this request" in failure


def test_a_usage_limit_parks_the_task_to_its_reset_minute_and_resumes_the_same_session(
    repo: Path, codex_home: Path, api: StandIn
) -> None:
    setup(repo, codex_home)
    # Codex shows the reset to the minute ("Try again at 7:14 AM."): a reset in the last
    # second of a minute is shown as that minute, and parked to its end.
    minute_end = (int(time.time() + 4) // 60 + 1) * 60
    api.push(usage_limit(resets_at=minute_end - 1))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "limited")
        parked = wait_task_status(c, "limited", "rate_limited", timeout=60)
        [event] = wait_for_events(c, {"agent.rate_limited"}, 1, timeout=10)
        first = agent_of(c, "limited")
        assert api.resets == [minute_end - 1]
        shown = datetime.fromtimestamp(minute_end - 60).strftime("%-I:%M %p")
        assert f"Try again at {shown}." in str(event.data["message"])
        assert event.data["limitType"] == "usage_limit"
        assert float(event.data["resetsAt"]) == minute_end
        assert epoch(str(parked["resumeAt"])) == pytest.approx(minute_end + 1, abs=0.01)
        task = wait_task_status(c, "limited", "review", timeout=120)
        second = agent_of(c, "limited")
        assert second["id"] != first["id"]
        assert epoch(second["startedAt"]) >= minute_end
        argv = spec_argv(second)
        assert argv[argv.index("resume") + 1] == first["sessionId"]
        assert second["sessionId"] == first["sessionId"]
        texts = api.user_texts()
        assert "do the task" in texts  # the first prompt is still in the conversation
        assert any("interrupted by a rate limit" in t for t in texts)
        assert len(event_log(c, types={"agent.rate_limited"})) == 1
        assert task["status"] == "review"


def test_a_daemon_killed_mid_run_reattaches_codex_and_loses_none_of_its_output(
    repo: Path, codex_home: Path, api: StandIn
) -> None:
    setup(repo, codex_home)
    gate = threading.Event()
    api.push(
        call("exec_command", {"cmd": "printf 'kept\\n' > kept.txt"}),
        Turn(text=AFTER_RESTART, gate=gate),
    )
    with killed_mid_run(repo, api, gate=gate, timeout=60) as (c2, agent):
        # Every line codex printed was read once: tokens and cost of both calls.
        assert (agent["inputTokens"], agent["outputTokens"]) == (2400, 160)
        price = PRICES["gpt-5-codex"]
        expected = (2400 * price.input + 160 * price.output) / 1_000_000
        assert_cost_counted_once(c2, "crash", expected)
