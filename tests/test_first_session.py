"""A newcomer's first session, as the README tells it: ``gridctl init`` in a fresh repository,
``gridctl plan apply plan.yaml`` of the sample plan it wrote, a session with the bundled
example agent, approvals, and every task merged into the session's branch.

The real CLI runs as a subprocess and starts a real gridd; ``GRID_EXAMPLE_DELAY=0`` makes
the example agent quick. The configuration is the one ``init`` wrote, nothing else.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gridd.cli.init_cmd import config_text
from gridd.runs import landlock
from gridd.settings import load_settings
from tests.support import cli as support_cli
from tests.support.processes import daemons_serving
from tests.support.waits import wait_for

ENV = {**support_cli.GRIDCTL_ENV, "COLUMNS": "200", "GRID_EXAMPLE_DELAY": "0"}


def gridctl(root: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return support_cli.gridctl(root, *args, timeout=timeout, env=ENV)


def tasks(root: Path) -> dict[str, dict[str, Any]]:
    listed = gridctl(root, "task", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return {task["id"]: task for task in json.loads(listed.stdout)}


def test_init_then_the_sample_plan_runs_with_the_example_agent_to_merged(ws: Path) -> None:
    inited = gridctl(ws, "init")
    assert inited.returncode == 0, inited.stderr
    assert inited.stdout.startswith(f"wrote .grid/config.toml and plan.yaml in {ws}\n")
    for step in ("gridctl plan apply plan.yaml", "gridctl session start --branch try-gridd"):
        assert step in inited.stdout
    assert os.stat(ws / ".grid" / "config.toml").st_mode & 0o077 == 0

    applied = gridctl(ws, "plan", "apply", "plan.yaml")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.startswith("applied plan.yaml: 3 tasks\n")
    assert tasks(ws)["docs-links"]["dependsOn"] == ["usage", "contributing"]

    started = gridctl(ws, "session", "start", "--branch", "try-gridd")
    assert started.returncode == 0, started.stderr
    # The two independent tasks come back for review; the third waits for them.
    for _round in range(2):
        idle = gridctl(ws, "status", "--watch", "--until-idle", timeout=90)
        assert idle.returncode == 0, idle.stderr
        approved = gridctl(ws, "task", "approve", "--all")
        assert approved.returncode == 0, approved.stderr
        assert "approved: now merging" in approved.stdout
    wait_for(
        lambda: {t["status"] for t in tasks(ws).values()} == {"done"},
        timeout=60,
        interval=0.3,
        message="every task merged",
    )
    for task_id in ("usage", "contributing", "docs-links"):
        shown = subprocess.run(
            ["git", "-C", str(ws), "show", f"try-gridd:notes/{task_id}.md"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        assert "Done by the gridd example agent." in shown.stdout


def test_init_never_overwrites_and_says_so(ws: Path) -> None:
    (ws / "plan.yaml").write_text("mine\n")
    first = gridctl(ws, "init")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("wrote .grid/config.toml in ")
    assert first.stderr == "gridctl: plan.yaml exists; left as it is\n"
    assert (ws / "plan.yaml").read_text() == "mine\n"
    (ws / ".grid" / "config.toml").write_text("# mine\n")
    again = gridctl(ws, "init")
    assert again.returncode == 1
    assert "gridctl: .grid/config.toml exists; left as it is" in again.stderr
    assert (ws / ".grid" / "config.toml").read_text() == "# mine\n"
    assert not daemons_serving(ws)


@pytest.mark.parametrize("abi", [0, 3, 7])
def test_the_configs_commented_claude_lines_are_valid_when_uncommented(
    tmp_path: Path, abi: int
) -> None:
    """What the comments tell a user to uncomment is configuration gridd accepts."""
    assert load_settings_text(tmp_path, config_text(abi)).scheduler.default_agent == "example"
    setting = re.compile(r"^# (\[[a-z.]+\]|[a-z_]+ = .*)$")
    uncommented = "\n".join(
        match.group(1) if (match := setting.match(line)) else line
        for line in config_text(abi).splitlines()
    )
    settings = load_settings_text(tmp_path, uncommented)
    assert settings.scheduler.default_agent == "claude"
    claude = settings.profiles()["claude"]
    assert claude.adapter == "claude"
    assert claude.adapter_options["permission_mode"] == "acceptEdits"
    assert (claude.sandbox.mode, claude.sandbox.network) == ("workspace", "allowlist")


@pytest.mark.parametrize("abi", range(8))
def test_init_turns_the_claude_sandbox_on_as_far_as_the_kernel_can_enforce_it(
    tmp_path: Path, abi: int
) -> None:
    """On any kernel, the claude profile init writes starts (a sandbox the kernel cannot
    enforce would fail every run with sandbox_unavailable), and is as confined as the
    kernel allows: workspace and the API allowlist from ABI 4, workspace from ABI 1."""
    settings = load_settings_text(tmp_path, config_text(abi))
    claude = settings.profiles()["claude"]
    box = claude.sandbox
    assert landlock.unavailable(box.mode, abi, box.network) is None
    assert claude.command[0] == "claude" and claude.adapter == "claude"  # still the built-in
    expected = "off" if abi == 0 else "workspace", "allowlist" if abi >= 4 else "allow"
    assert (box.mode, box.network) == expected
    if abi >= 4:
        assert box.allow_hosts == ["api.anthropic.com", "platform.claude.com"]


def test_init_on_this_kernel_sandboxes_claude_and_doctor_needs_no_claude(ws: Path) -> None:
    """The written config turns the sandbox on (this kernel has Landlock ABI 4 or more),
    and a newcomer without Claude Code installed sees nothing to fix in doctor."""
    if landlock.abi_version() < landlock.NET_ABI:
        pytest.skip("this kernel's Landlock has no TCP rules")
    inited = gridctl(ws, "init")
    assert inited.returncode == 0, inited.stderr
    assert "Claude Code's profile is sandboxed" in inited.stdout
    claude = load_settings(ws / ".grid" / "config.toml").profiles()["claude"]
    assert (claude.sandbox.mode, claude.sandbox.network) == ("workspace", "allowlist")
    doctor = support_cli.gridctl(ws, "doctor", timeout=30, env={**ENV, "PATH": "/usr/bin:/bin"})
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "sandboxed: claude (workspace)" in doctor.stdout
    assert "binary claude" not in doctor.stdout


def load_settings_text(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_settings(path)
