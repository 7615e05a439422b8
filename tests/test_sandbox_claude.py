"""The real Claude Code CLI (pinned in tests/tools/agent-clis.txt) finishes a task inside
the workspace sandbox, against the loopback stand-in of the Messages API, which its
network allowlist names (it reaches it through its run's proxy): Write and Bash
work in its worktree, its own state (``~/.claude``, ``~/.claude.json``, made for it when
missing: a first run) is writable, and a
command that reaches outside gets the ordinary "Permission denied", which the model sees.
A whole task (Write, Edit, a test run with Bash, a commit of its own) goes on across a rate
limit: the run parks, and the resumed one (``--resume``, in the same sandbox) picks up the
session the first one left in ``~/.claude``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.runs import landlock
from tests.anthropic_standin import StandIn, limit, standin, tool
from tests.real_cli import (
    agent_of,
    claude_profile,
    epoch,
    needs,
    shown_on_failure,
    spec_argv,
    start,
)
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.repos import write_core_config
from tests.support.sse import event_log, wait_for_events

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


CALC = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\nprint('calc test passed')\n"


def test_a_whole_sandboxed_claude_task_resumes_its_session_after_a_rate_limit(
    repo: Path, tmp_path: Path, api: StandIn
) -> None:
    """Write, Edit, a test run and a commit with Bash, then a subscription limit: the run
    parks, and at the reset the task resumes (``--resume``) in the same sandbox. The resumed
    CLI sends the model the whole earlier conversation, which it can only have read from
    the session it wrote in ``~/.claude`` (a writable default of the sandbox: without it
    the session is never saved, and the resume finds nothing)."""
    home = tmp_path / "home"
    profile = claude_profile(
        api.url, home, oauth=True, allowed_tools=["Bash", "Write", "Edit", "Read"]
    )
    profile["sandbox"] = {
        "mode": "workspace",
        "network": "allowlist",
        "allow_hosts": [api.url.removeprefix("http://")],
    }
    write_core_config(repo, agents={"claude": profile}, scheduler={"default_agent": "claude"})
    worktree = repo / ".grid" / "worktrees" / "calc"
    # -B: the first run's calc.pyc would have the edited source's size and (within the same
    # second) its mtime, and be taken for it where bytecode is written (a clean environment).
    run_test = {"command": "python3 -B test_calc.py", "description": "run the test"}
    commit = {"command": "git add -A && git commit -qm 'add: calc' && echo committed"}
    api.push(
        tool("Write", {"file_path": str(worktree / "calc.py"), "content": CALC}),
        tool("Write", {"file_path": str(worktree / "test_calc.py"), "content": TEST}),
        tool("Bash", run_test),
        tool(
            "Edit",
            {
                "file_path": str(worktree / "calc.py"),
                "old_string": "a - b",
                "new_string": "a + b",
            },
        ),
        tool("Bash", run_test),
        tool("Bash", {**commit, "description": "commit the work"}),
        limit("five_hour", reset_in=4),
        tool("Bash", {"command": "git log --format=%s", "description": "what is done"}),
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "calc")
        wait_task_status(c, "calc", "rate_limited", timeout=120)
        [parked] = wait_for_events(c, {"agent.rate_limited"}, 1, timeout=10)
        first = agent_of(c, "calc")
        task = wait_task_status(c, "calc", "review", timeout=120)
        second = agent_of(c, "calc")
        denied = event_log(c, types={"agent.sandbox_denied"})
    assert first["sandbox"]["mode"] == second["sandbox"]["mode"] == "workspace"
    assert second["id"] != first["id"] and second["exitCode"] == 0, second
    assert epoch(second["startedAt"]) >= float(parked.data["resetsAt"])
    argv = spec_argv(second)
    # The same attempt, resumed: without its session in ~/.claude the --resume run finds
    # none and fails, and the task starts over as a second attempt, from nothing.
    assert task["attempts"] == 1, task
    assert "--resume" in argv, f"no session in ~/.claude to resume: {argv}"
    assert argv[argv.index("--resume") + 1] == first["sessionId"]
    # The work: written, run (failing), edited, run again (passing), committed by the
    # agent itself in its own repository, and fetched back onto the task's branch.
    results = [str(r["content"]) for r in api.tool_results()]
    assert "AssertionError" in results[2] and "-1" in results[2], results
    assert "calc test passed" in results[4] and "committed" in results[5], results
    assert git_show(repo, "grid/calc:calc.py") == CALC.replace("a - b", "a + b")
    assert sorted(task["changedFiles"]) == ["calc.py", "test_calc.py"]
    assert "add: calc" in results[6], results
    # The resumed turn carried the first run's conversation, from its session in ~/.claude.
    resumed = [
        t for t in api.turns() if "interrupted by a rate limit" in " ".join(api.user_texts(t))
    ]
    assert resumed, [api.user_texts(t) for t in api.turns()]
    history = str(resumed[0]["messages"])
    assert "calc test passed" in history and "committed" in history
    assert not denied, [e.data for e in denied]
