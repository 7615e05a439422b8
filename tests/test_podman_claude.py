"""The real Claude Code CLI (pinned in tests/tools/agent-clis.txt) finishes a task in a podman
container, against the loopback stand-in of the Messages API: spawned by the in-box shim,
its stream-json read back through the mirror, its tool permission answered through the
inbox, and its branch fetched back as a bundle and merged.

The pinned CLI is a native program (no Node in the box): its install directory is mounted
read-only at the same path, so no registry is reached from inside the box. The box shares
the host's network (``network = "host"``) to reach the stand-in on 127.0.0.1
(docs/executors.md). Needs root, podman, runc and mmdebstrap, like tests/test_podman_runs.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.runs.image import default_cache_dir, ensure_image
from tests.anthropic_standin import StandIn, standin, tool
from tests.real_cli import agent_of, claude_profile, clis_root, needs, shown_on_failure, start
from tests.support.api import wait_pending_question, wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.repos import write_core_config
from tests.support.waits import wait_for

MISSING = [name for name in ("podman", "runc", "mmdebstrap") if shutil.which(name) is None]
pytestmark = [
    needs("claude"),
    pytest.mark.xdist_group("podman"),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        bool(MISSING) or os.geteuid() != 0,
        reason=f"needs root and podman, runc, mmdebstrap (missing: {', '.join(MISSING) or 'root'});"
        " as root: apt-get install -y podman runc mmdebstrap",
    ),
]

#: Where the shim clones the task's branch inside the box (runs/boxshim.py).
WORK = "/grid/work"


@pytest.fixture
def api(repo: Path) -> Iterator[StandIn]:
    with standin() as server, shown_on_failure(repo):
        yield server


def containers(task: str) -> list[dict[str, object]]:
    out = subprocess.run(
        ["podman", "ps", "--all", f"--filter=label=grid.task={task}", "--format=json"],
        capture_output=True,
        check=True,
    ).stdout
    return list(json.loads(out or b"[]"))


@pytest.fixture
def boxed() -> Iterator[str]:
    task = "boxed-claude"
    yield task
    for row in containers(task):
        names = [str(n) for n in row.get("Names") or []]  # type: ignore[attr-defined]
        subprocess.run(["podman", "rm", "-f", "-t", "0", *names], capture_output=True)


def test_the_real_claude_cli_finishes_a_task_in_a_podman_container_and_is_merged(
    repo: Path, tmp_path: Path, api: StandIn, boxed: str
) -> None:
    image = ensure_image(
        ["podman"], suite="bookworm", packages=["git", "python3"], cache_dir=default_cache_dir()
    )
    home = tmp_path / "home"
    # A permission prompt (Bash is not allowed up front): asked over stream-json, answered
    # from the host through the box's inbox.
    profile = claude_profile(api.url, home, allowed_tools=["Write"])
    write_core_config(repo, agents={"claude": profile}, scheduler={"default_agent": "claude"})
    cli = clis_root() / "claude"
    with (repo / ".grid" / "config.toml").open("a") as config:
        config.write(
            '\n[executors]\ndefault = "podman"\n[executors.podman]\n'
            f'image = "{image}"\nnetwork = "host"\nlook_seconds = 0.1\n'
            f"mounts = {json.dumps([f'{cli}:{cli}:ro', f'{home}:{home}'])}\n"
        )
    api.push(
        tool("Write", {"file_path": f"{WORK}/hello.txt", "content": "hello from a box\n"}),
        tool("Bash", {"command": "uname -n > where.txt && cat /etc/debian_version"}),
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, boxed)
        question = wait_pending_question(c, boxed, timeout=120)
        assert str(question["question"]).startswith("Allow Bash: "), question
        [box] = containers(boxed)  # the run is in a container, labelled with its task
        agent = agent_of(c, boxed)
        assert agent["executor"]["kind"] == "podman", agent["executor"]
        assert agent["executor"]["box"] == box["Names"][0]  # type: ignore[index]
        c.post(f"/questions/{question['id']}/answer", {"response": "allow"})
        task = wait_task_status(c, boxed, "review", timeout=120)
        agent = agent_of(c, boxed)
        assert agent["exitCode"] == 0, agent
        assert sorted(task["changedFiles"]) == ["hello.txt", "where.txt"]
        assert git_show(repo, f"grid/{boxed}:hello.txt") == "hello from a box\n"
        c.post(f"/tasks/{boxed}/approve")
        wait_task_status(c, boxed, "done", timeout=60)
        assert git_show(repo, "feature/real-cli:hello.txt") == "hello from a box\n"  # merged
        wait_for(lambda: containers(boxed) == [], timeout=30, message="the container removed")
    write, bash = api.tool_results()
    assert "created successfully" in str(write["content"]), write
    # Bash ran in the box: a Debian root file system, whatever the host is.
    assert str(bash["content"]).strip()[:2].isdigit(), bash
    # Its stream-json came back through the mirror, in order, into the host's run directory.
    lines = (Path(agent["runDir"]) / "output.log").read_text().splitlines()
    kinds = [json.loads(line).get("type") for line in lines if line.startswith("{")]
    assert kinds[0] == "system" and kinds[-1] == "result", kinds
