"""The real Claude Code CLI (pinned in tests/tools/agent-clis.txt) finishes a task inside
the workspace sandbox, against the loopback stand-in of the Messages API, which its
network allowlist names (it reaches it through its run's proxy): Write and Bash
work in its worktree, its own state (``~/.claude``, ``~/.claude.json``, made for it when
missing: a first run) is writable, and a
command that reaches outside gets the ordinary "Permission denied", which the model sees.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.runs import landlock
from tests.anthropic_standin import StandIn, standin, tool
from tests.helpers import (
    core_daemon,
    event_log,
    git_show,
    wait_task_status,
    write_core_config,
)
from tests.real_cli import agent_of, claude_profile, needs, shown_on_failure, start

pytestmark = [
    needs("claude"),
    pytest.mark.skipif(landlock.abi_version() < 1, reason="this kernel offers no Landlock"),
    pytest.mark.timeout(180),
]


@pytest.fixture
def api(repo: Path) -> Iterator[StandIn]:
    with standin() as server, shown_on_failure(repo):
        yield server


def test_the_real_claude_cli_finishes_a_task_inside_the_workspace_sandbox(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_test").write_text("-----BEGIN TEST KEY-----\n")
    profile = claude_profile(api.url, home, allowed_tools=["Bash", "Write"])
    # Its network: the stand-in of the API, through the run's proxy, and nothing else.
    standin_host = api.url.removeprefix("http://")
    profile["sandbox"] = {
        "mode": "workspace",
        "network": "allowlist",
        "allow_hosts": [standin_host],
    }
    write_core_config(repo, agents={"claude": profile}, scheduler={"default_agent": "claude"})
    worktree = repo / ".grid" / "worktrees" / "box"
    escape = (
        f"echo x > {home}/escape.txt; cat {home}/.ssh/id_test;"
        " curl -s -o /dev/null -w 'proxy said %{http_code}' http://example.invalid/;"
        " echo ran > bash.txt"
    )
    api.push(
        tool("Write", {"file_path": str(worktree / "hello.txt"), "content": "hello\n"}),
        tool("Bash", {"command": escape, "description": "reach outside, then work"}),
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "box")
        task = wait_task_status(c, "box", "review", timeout=120)
        agent = agent_of(c, "box")
        denied = [e.data["target"] for e in event_log(c, types={"agent.sandbox_denied"})]
    assert agent["exitCode"] == 0, agent
    assert agent["sandbox"]["mode"] == "workspace"
    assert sorted(task["changedFiles"]) == ["bash.txt", "hello.txt"]
    assert git_show(repo, "grid/box:hello.txt") == "hello\n"
    write, bash = api.tool_results()
    assert "created successfully" in str(write["content"])
    assert str(bash["content"]).count("Permission denied") == 2, bash
    assert not (home / "escape.txt").exists()
    assert "TEST KEY" not in str(bash["content"])
    # Its requests went through its proxy (the only TCP port the kernel lets it reach),
    # which let the stand-in through and refused the rest.
    assert "proxy said 403" in str(bash["content"]), bash
    assert denied == ["example.invalid:80"], denied
    # Its state, made for it on this first run, is its own to write.
    assert (home / ".claude").is_dir() and (home / ".claude.json").is_file()
