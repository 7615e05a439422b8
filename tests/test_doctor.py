"""``gridctl doctor``: each planted problem is found, with a fix, and makes it exit 1;
a healthy workspace passes with exit 0. Real files, processes, locks and programs."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gridd import trust
from gridd.cli.doctor_checks import grid_dir_verdict
from tests.support.cli import gridctl
from tests.support.daemons import running_daemon
from tests.support.repos import write_config


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    state = tmp_path / "state"
    state.mkdir()
    return {**os.environ, "XDG_STATE_HOME": str(state), "COLUMNS": "200"}


def doctor(repo: Path, env: dict[str, str]) -> tuple[int, dict[str, dict[str, Any]]]:
    result = gridctl(repo, "doctor", "--json", env=env)
    assert "Traceback" not in result.stderr, result.stderr
    checks = {c["check"]: c for c in json.loads(result.stdout)}
    return result.returncode, checks


def fake_program(bindir: Path, name: str, script: str) -> None:
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_a_healthy_workspace_passes(repo: Path, env: dict[str, str]) -> None:
    with running_daemon(repo):
        code, checks = doctor(repo, env)
    assert code == 0, checks
    assert {c["verdict"] for c in checks.values()} <= {"ok", "warn"}
    assert checks["daemon"]["detail"].startswith("running: pid")
    assert "quick_check ok" in checks["database"]["detail"]
    human = gridctl(repo, "doctor", env=env)
    assert human.returncode == 0
    assert "nothing needs action" in human.stdout


def test_an_old_git_fails_with_the_version_needed(
    repo: Path, env: dict[str, str], tmp_path: Path
) -> None:
    real = shutil.which("git")
    fake_program(
        tmp_path / "bin",
        "git",
        f'[ "$1" = "--version" ] && {{ echo "git version 2.30.2"; exit 0; }}\nexec {real} "$@"\n',
    )
    code, checks = doctor(repo, {**env, "PATH": f"{tmp_path / 'bin'}:{env['PATH']}"})
    assert code == 1
    git = checks["git"]
    assert git["verdict"] == "fail"
    assert "2.30.2" in git["detail"] and ">= 2.38" in git["detail"]
    assert git["fix"]


def test_a_missing_agent_binary_fails_naming_the_config_key(
    repo: Path, env: dict[str, str], tmp_path: Path
) -> None:
    fake_program(tmp_path / "bin", "claude", 'echo "2.1.197 (Claude Code)"\n')
    write_config(
        repo,
        textwrap.dedent(
            """
            [scheduler]
            default_agent = "claude"
            [agents.helper]
            command = ["no-such-agent-xyz", "{prompt}"]
            """
        ),
    )
    code, checks = doctor(repo, {**env, "PATH": f"{tmp_path / 'bin'}:{env['PATH']}"})
    assert code == 1
    missing = checks["binary no-such-agent-xyz"]
    assert missing["verdict"] == "fail"
    assert "agents.helper.command" in missing["detail"]
    assert "install no-such-agent-xyz" in missing["fix"]
    claude = checks["binary claude"]
    assert claude["verdict"] == "ok"
    assert "2.1.197 (Claude Code)" in claude["detail"]


def test_a_grid_dir_others_may_only_read_is_a_warning_gridd_fixes_when_it_starts(
    repo: Path, env: dict[str, str]
) -> None:
    grid = repo / ".grid"
    grid.mkdir()
    grid.chmod(0o755)  # a umask of 022
    code, checks = doctor(repo, env)
    assert code == 0, checks
    assert checks[".grid/"]["verdict"] == "warn"
    assert "0o755" in checks[".grid/"]["detail"]
    assert "gridd tightens it to 0700 each time it starts" in checks[".grid/"]["detail"]
    assert checks[".grid/"]["fix"] == f"chmod 700 {grid}"
    with running_daemon(repo):
        assert stat.S_IMODE(grid.stat().st_mode) == 0o700  # as the warning says
        code, checks = doctor(repo, env)
    assert checks[".grid/"]["verdict"] == "ok", checks[".grid/"]


def test_a_grid_dir_others_may_write_to_fails(repo: Path, env: dict[str, str]) -> None:
    grid = repo / ".grid"
    grid.mkdir()
    grid.chmod(0o777)
    code, checks = doctor(repo, env)
    assert code == 1
    assert checks[".grid/"]["verdict"] == "fail"
    assert "0o777" in checks[".grid/"]["detail"]
    assert "can write in it" in checks[".grid/"]["detail"]
    assert checks[".grid/"]["fix"].startswith(f"chmod 700 {grid}, then check")


@pytest.mark.parametrize(
    ("mode", "owner", "verdict"),
    [
        (stat.S_IFDIR | 0o700, 1000, "ok"),
        (stat.S_IFDIR | 0o500, 1000, "ok"),
        (stat.S_IFDIR | 0o755, 1000, "warn"),
        (stat.S_IFDIR | 0o750, 1000, "warn"),
        (stat.S_IFDIR | 0o701, 1000, "warn"),
        (stat.S_IFDIR | 0o2700, 1000, "warn"),
        (stat.S_IFDIR | 0o770, 1000, "fail"),
        (stat.S_IFDIR | 0o702, 1000, "fail"),
        (stat.S_IFDIR | 0o1777, 1000, "fail"),
        (stat.S_IFDIR | 0o700, 0, "fail"),
        (stat.S_IFDIR | 0o755, 0, "fail"),
        (stat.S_IFLNK | 0o777, 1000, "fail"),
        (stat.S_IFREG | 0o600, 1000, "fail"),
    ],
)
def test_grid_dir_verdict_warns_only_for_what_gridd_tightens_itself(
    mode: int, owner: int, verdict: str
) -> None:
    assert grid_dir_verdict(mode, owner=owner, uid=1000) == verdict


def test_a_world_accessible_socket_fails(repo: Path, env: dict[str, str]) -> None:
    with running_daemon(repo) as daemon:
        daemon.sock.chmod(0o666)
        code, checks = doctor(repo, env)
    assert code == 1
    assert checks["socket"]["verdict"] == "fail"
    assert "0o666" in checks["socket"]["detail"]


@pytest.fixture
def lock_holder(repo: Path) -> Iterator[subprocess.Popen[str]]:
    """A process that holds gridd.lock (as a hung daemon would) and serves nothing."""
    grid = repo / ".grid"
    grid.mkdir(mode=0o700)
    program = textwrap.dedent(
        f"""
        import fcntl, os, sys, time
        fd = os.open({str(grid / "gridd.lock")!r}, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{{os.getpid()}}\\n".encode())
        print("locked", flush=True)
        time.sleep(120)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    yield proc
    proc.kill()
    proc.wait()


def test_a_lock_held_with_no_daemon_fails_naming_the_holder(
    repo: Path, env: dict[str, str], lock_holder: subprocess.Popen[str]
) -> None:
    code, checks = doctor(repo, env)
    assert code == 1
    lock = checks["lock"]
    assert lock["verdict"] == "fail"
    assert f"pid {lock_holder.pid}" in lock["detail"]
    assert f"kill {lock_holder.pid}" in lock["fix"]


def test_a_stale_pid_file_and_socket_are_warnings(repo: Path, env: dict[str, str]) -> None:
    with running_daemon(repo) as daemon:
        daemon.kill9()  # leaves gridd.pid and gridd.sock behind
    code, checks = doctor(repo, env)
    assert checks["pid file"]["verdict"] == "warn"
    assert "not running" in checks["pid file"]["detail"]
    assert checks["socket"]["verdict"] == "warn"
    assert code == 0  # gridd copes with both by itself


def commit_config(repo: Path) -> None:
    """A config that came with the repository (committed), which is what needs trust."""
    subprocess.run(["git", "-C", str(repo), "add", "-f", ".grid/config.toml"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "config"], check=True)


def test_an_untrusted_committed_config_fails_and_a_trusted_one_passes(
    repo: Path, env: dict[str, str]
) -> None:
    write_config(repo, '[agents.mine]\ncommand = ["sh", "-c", "echo hi"]\n')
    commit_config(repo)
    code, checks = doctor(repo, env)
    assert code == 1
    assert checks["config trust"]["verdict"] == "fail"
    assert "not trusted yet" in checks["config trust"]["detail"]
    assert "gridctl trust" in checks["config trust"]["fix"]
    trust.record(repo / ".grid" / "config.toml", env)  # what `gridctl trust` writes
    code, checks = doctor(repo, env)
    assert checks["config trust"]["verdict"] == "ok", checks["config trust"]
    assert code == 0, checks
    with (repo / ".grid" / "config.toml").open("a") as fh:
        fh.write('env = { A = "1" }\n')
    code, checks = doctor(repo, env)
    assert code == 1
    assert "changed since it was trusted" in checks["config trust"]["detail"]


def test_a_config_written_in_this_clone_needs_no_trust_as_the_daemon_agrees(
    repo: Path, env: dict[str, str]
) -> None:
    write_config(repo, '[agents.mine]\ncommand = ["sh", "-c", "echo hi"]\n')
    code, checks = doctor(repo, env)
    assert checks["config trust"]["verdict"] == "ok", checks["config trust"]
    assert "not committed" in checks["config trust"]["detail"]
    assert code == 0, checks


def test_a_corrupt_database_fails(repo: Path, env: dict[str, str]) -> None:
    grid = repo / ".grid"
    grid.mkdir(mode=0o700)
    (grid / "gridd.db").write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
    code, checks = doctor(repo, env)
    assert code == 1
    assert checks["database"]["verdict"] == "fail"
    assert "quarantine" in checks["database"]["fix"] or "moves" in checks["database"]["fix"]


def test_a_pid_file_naming_a_program_that_reused_the_pid_is_a_warning_not_a_kill(
    repo: Path, env: dict[str, str]
) -> None:
    grid = repo / ".grid"
    grid.mkdir(mode=0o700, exist_ok=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        (grid / "gridd.pid").write_text(f"{other.pid}\n")
        code, checks = doctor(repo, env)
        pid_check = checks["pid file"]
        assert pid_check["verdict"] == "warn"
        assert "not a gridd" in pid_check["detail"] and "sleep 60" in pid_check["detail"]
        assert "kill" not in pid_check["fix"]
        assert checks["lock"]["verdict"] == "ok"
        assert other.poll() is None
        assert code == 0  # a warning: nothing needs action
    finally:
        other.kill()
        other.wait()


def test_an_empty_database_file_is_a_warning_not_ok(repo: Path, env: dict[str, str]) -> None:
    grid = repo / ".grid"
    grid.mkdir(mode=0o700, exist_ok=True)
    (grid / "gridd.db").write_bytes(b"")
    code, checks = doctor(repo, env)
    assert checks["database"]["verdict"] == "warn"
    assert "empty (0 bytes)" in checks["database"]["detail"]
    assert (grid / "gridd.db").stat().st_size == 0  # doctor changes nothing
    assert code == 0


def test_a_symlinked_log_fails_as_the_daemon_would_refuse_it(
    repo: Path, env: dict[str, str], tmp_path: Path
) -> None:
    grid = repo / ".grid"
    grid.mkdir(mode=0o700, exist_ok=True)
    outside = tmp_path / "elsewhere.log"
    outside.write_text("")
    (grid / "gridd.log").symlink_to(outside)
    code, checks = doctor(repo, env)
    assert code == 1
    assert checks["links"]["verdict"] == "fail"
    assert "gridd.log is a symbolic link" in checks["links"]["detail"]
    assert checks["links"]["fix"] == f"rm {grid / 'gridd.log'}"
    started = gridctl(repo, "daemon", "start", env=env)
    assert started.returncode == 1 and "symbolic link" in started.stderr  # as doctor said
