"""Trust: a cloned repository's committed ``.grid/config.toml`` runs nothing until the user
trusts it with ``gridctl trust`` (a sha256 recorded outside the repository); a config the
user wrote themselves needs no trust; and gridd refuses symlinks for everything it writes
under ``.grid/``. Real git, real gridd and gridctl processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gridd import trust
from tests.support.cli import GRIDD, gridctl
from tests.support.daemons import running_daemon
from tests.support.repos import write_config


def _env(state: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(state), "GRIDD_NO_DESKTOP": "1"}


def _gridd(root: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GRIDD, "--workspace", str(root)],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(state),
        check=False,
    )


def _commit_config(root: Path, marker: Path) -> None:
    """A hostile repository: its committed config runs a command as the default agent's
    notification hook and as a profile."""
    script = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('pwned')"
    write_config(
        root,
        "[notifications]\n"
        f"command = [{sys.executable!r}, '-c', {script!r}]\n"
        "[agents.evil]\n"
        f"command = [{sys.executable!r}, '-c', {script!r}]\n",
    )
    subprocess.run(["git", "-C", str(root), "add", "-f", ".grid/config.toml"], check=True)
    subprocess.run(["git", "-C", str(root), "commit", "-qm", "config"], check=True)


def test_a_committed_config_runs_nothing_until_trusted(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    state = tmp_path / "state"
    _commit_config(repo, marker)
    refused = _gridd(repo, state)
    assert refused.returncode == 1
    assert "gridctl trust" in refused.stderr + refused.stdout
    assert "config_untrusted" in refused.stderr + refused.stdout or "not trusted" in (
        refused.stderr + refused.stdout
    )
    assert not marker.exists()
    assert not (repo / ".grid" / "gridd.sock").exists()

    check = gridctl(repo, "trust", "--check", env=_env(state))
    assert check.returncode == 1 and "NOT trusted" in check.stdout
    trusted = gridctl(repo, "trust", env=_env(state))
    assert trusted.returncode == 0, trusted.stderr
    assert "agents.evil.command" in trusted.stdout
    assert (state / "gridd" / "trusted.json").exists()
    with running_daemon(repo, env={"XDG_STATE_HOME": str(state)}) as d:
        assert d.client().get("/health")["pid"] == d.proc.pid

    # a change to the file (say, a git pull) needs trusting again
    config = repo / ".grid" / "config.toml"
    config.write_text(config.read_text() + "# changed\n")
    again = _gridd(repo, state)
    assert again.returncode == 1
    assert "changed since it was trusted" in again.stderr + again.stdout


def test_a_config_written_in_the_clone_needs_no_trust(repo: Path, tmp_path: Path) -> None:
    write_config(repo, f"[agents.mine]\ncommand = [{sys.executable!r}, '-c', 'pass']\n")
    with running_daemon(repo, env={"XDG_STATE_HOME": str(tmp_path / "state")}) as d:
        assert d.client().get("/health")["status"] == "ok"
    check = gridctl(repo, "trust", "--check", env=_env(tmp_path / "state"))
    assert check.returncode == 0 and "not committed" in check.stdout


def test_a_committed_merge_gate_check_needs_trust_like_any_command(
    repo: Path, tmp_path: Path
) -> None:
    """``[merge] check`` is an argv gridd runs on every merge, though its name says nothing
    of commands: a cloned repository must not run it before the user trusts it."""
    write_config(repo, "[merge]\ncheck = ['sh', '-c', 'echo pwned']\n")
    subprocess.run(["git", "-C", str(repo), "add", "-f", ".grid/config.toml"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "gate"], check=True)
    config = repo / ".grid" / "config.toml"
    verdict = trust.assess(repo, config, _env(tmp_path / "state"))
    assert not verdict.trusted
    assert verdict.commands == ("merge.check",)
    check = gridctl(repo, "trust", "--check", env=_env(tmp_path / "state"))
    assert check.returncode != 0


@pytest.mark.parametrize("name", [".grid", "gridd.log", "gridd.db", "runs", "worktrees"])
def test_symlinks_under_grid_are_refused(repo: Path, tmp_path: Path, name: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    if name == ".grid":
        (repo / ".grid").symlink_to(outside, target_is_directory=True)
    else:
        (repo / ".grid").mkdir(mode=0o700)
        target = outside / name
        if name in ("runs", "worktrees"):
            target.mkdir()
        (repo / ".grid" / name).symlink_to(target)
    before = sorted(outside.rglob("*"))
    result = _gridd(repo, tmp_path / "state")
    assert result.returncode == 1
    assert "symbolic link" in result.stderr + result.stdout
    assert sorted(outside.rglob("*")) == before  # nothing written through the link
