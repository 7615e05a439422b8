"""The real Claude Code CLI (pinned, installed by tests/tools/install-claude.sh) run by the
real daemon against a loopback stand-in of the Messages API (tests/anthropic_standin.py):
the task finishes and reaches review, questions reach a human and their answers reach the
model, follow-ups start turns, and rate limits park and resume the task at the right second.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gridd.client import GridClient
from tests.anthropic_standin import StandIn, standin, tool
from tests.helpers import (
    core_daemon,
    event_log,
    git_show,
    wait_pending_question,
    wait_task_status,
    write_core_config,
)

ROOT = Path(__file__).resolve().parent.parent
CLAUDE = ROOT / ".cache/claude-code/node_modules/@anthropic-ai/claude-code-linux-x64/claude"

pytestmark = [
    pytest.mark.skipif(
        not CLAUDE.exists(), reason="run tests/tools/install-claude.sh (make test does)"
    ),
    pytest.mark.timeout(180),
]


@pytest.fixture
def api() -> Iterator[StandIn]:
    with standin() as server:
        yield server


def claude_profile(
    api: StandIn, home: Path, *, oauth: bool = False, retries: int = 0, **options: Any
) -> dict[str, object]:
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": api.url,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_RETRIES": str(retries),
    }
    # A subscriber's token makes the CLI report its usage limits (rate_limit_event).
    env["CLAUDE_CODE_OAUTH_TOKEN" if oauth else "ANTHROPIC_API_KEY"] = "sk-ant-standin-dummy"
    return {
        "adapter": "claude",
        "stdin": "pipe",
        "command": [
            str(CLAUDE),
            "-p",
            "--output-format",
            "stream-json",
            "--input-format",
            "stream-json",
            "--verbose",
            "--permission-prompt-tool",
            "stdio",
        ],
        "adapter_options": {"permission_prompt_tool": "stdio", **options},
        "env": env,
        "launch_grace_seconds": 60,
    }


def setup(
    repo: Path,
    tmp_path: Path,
    api: StandIn,
    *,
    scheduler: dict[str, object] | None = None,
    **kw: Any,
) -> None:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    write_core_config(
        repo,
        agents={"claude": claude_profile(api, home, **kw)},
        scheduler={"default_agent": "claude", **(scheduler or {})},
    )


def start(c: GridClient, task_id: str, prompt: str = "do the task") -> None:
    c.post("/tasks", {"id": task_id, "title": task_id, "prompt": prompt})
    c.post("/session/start", {"featureBranch": "feature/claude"})


def agent_of(c: GridClient, task_id: str) -> dict[str, Any]:
    agents = [a for a in c.get("/agents", params={"all": "1"}) if a["taskId"] == task_id]
    return agents[-1]  # type: ignore[no-any-return]


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
        assert c.get("/tasks/write")["costUsd"] == pytest.approx(agent["costUsd"])
        [completed] = event_log(c, types={"agent.completed"})
        assert completed.data["costUsd"] == pytest.approx(agent["costUsd"])
        # The model saw the write succeed.
        [result] = api.tool_results()
        assert "created successfully" in str(result["content"])
