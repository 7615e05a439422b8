"""A sandboxed agent cannot hurt the machine: the kernel (Landlock, applied by the shim just
before ``exec``) refuses its writes outside its worktree and its reads of hidden paths, for
it and for whatever it leaves behind, while its own work is committed and merged as usual.

Real daemon, real shims, real processes on this kernel; each attack is also run with the
sandbox off (the control), where it succeeds, so the tests prove the sandbox did it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gridd.client import GridClient
from gridd.runs import landlock, shim
from tests.support.api import wait_task_status
from tests.support.cli import gridctl
from tests.support.daemons import core_daemon, restartable_daemon
from tests.support.git import git_show
from tests.support.repos import agent_command, write_core_config
from tests.support.waits import wait_for

pytestmark = pytest.mark.skipif(landlock.abi_version() < 1, reason="this kernel offers no Landlock")

ETC_PROBE = Path("/etc/gridd-sandbox-test")
ATTACKS = [
    "home",
    "outside",
    "etc",
    "other_worktree",
    "db",
    "git_config",
    "git_hook",
    "ssh_key",
    "symlink",
    "hardlink",
]


@pytest.fixture
def home() -> Iterator[Path]:
    """A home directory for the daemon and its agents, with a fixture SSH key."""
    with tempfile.TemporaryDirectory(prefix="gh") as d:
        (Path(d) / ".ssh").mkdir(mode=0o700)
        (Path(d) / ".ssh" / "id_test").write_text("-----BEGIN TEST KEY-----\n")
        yield Path(d)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside every worktree, with a file to hard-link to."""
    with tempfile.TemporaryDirectory(prefix="go") as d:
        (Path(d) / "victim.txt").write_text("not yours\n")
        yield Path(d)


def _config(repo: Path, outside: Path, mode: str, *, wait: bool = False) -> None:
    other = repo / ".grid" / "worktrees" / "victim"
    attack = [str(outside), str(repo), str(other), *(["wait"] if wait else [])]
    write_core_config(
        repo,
        agents={
            "boxed": {
                "command": agent_command("sandbox_attacks.py", *attack),
                "sandbox": {"mode": mode},
            },
            "plain": {"command": agent_command("hang.py", str(outside))},
        },
        scheduler={"default_agent": "boxed"},
    )


def _start(c: GridClient) -> None:
    """The attacker's task and another task, whose agent runs meanwhile, in a session."""
    c.post("/tasks", {"id": "victim", "title": "another task", "agent": "plain"})
    c.post("/tasks", {"id": "boxed", "title": "attacks", "maxAttempts": 1})
    c.post("/session/start", {"featureBranch": "feature/box", "maxAgents": 2})


def _shows_its_sandbox(c: GridClient, repo: Path, agent: dict[str, Any], mode: str) -> None:
    """``/agents/{id}`` and ``gridctl agents`` say what the run may write."""
    box = agent["sandbox"]
    worktree = os.path.realpath(agent["worktreePath"])
    tmpdir = os.path.realpath(Path(agent["runDir"]) / "tmp")
    assert box["mode"] == mode
    assert box["writable"] == [worktree, tmpdir]
    assert os.path.realpath(repo / ".grid") in box["hidden"]
    assert c.get(f"/agents/{agent['id']}")["sandbox"] == box
    listed = gridctl(repo, "agents", "--all", env={**os.environ, "COLUMNS": "300"})
    assert listed.returncode == 0, listed.stderr
    assert f"{mode}: worktree, TMPDIR" in listed.stdout, listed.stdout


def _attack(repo: Path, home: Path, outside: Path, mode: str) -> dict[str, dict[str, str]]:
    """Run the attacking agent beside another task's live agent; approve its work and see
    it merged. What each attack came to, for the agent and for its grandchild."""
    _config(repo, outside, mode)
    try:
        with core_daemon(repo, env={"HOME": str(home)}) as daemon:
            c = daemon.client()
            _start(c)
            wait_task_status(c, "boxed", "review", timeout=60)
            (agent,) = [a for a in c.get("/agents", params={"all": "1"}) if a["taskId"] == "boxed"]
            if mode != "off":
                _shows_its_sandbox(c, repo, agent, mode)
            c.post("/tasks/boxed/approve")
            wait_task_status(c, "boxed", "done", timeout=60)
            merged = {
                who: git_show(repo, f"feature/box:{who}.json") for who in ("attacks", "grandchild")
            }
    finally:
        ETC_PROBE.unlink(missing_ok=True)
    assert merged["attacks"] and merged["grandchild"], "the agent's work was not merged"
    return {who: json.loads(text or "{}") for who, text in merged.items()}


def test_a_workspace_sandbox_refuses_every_attack_and_still_merges_the_work(
    repo: Path, home: Path, outside: Path
) -> None:
    results = _attack(repo, home, outside, "workspace")
    for who, result in results.items():
        assert result == dict.fromkeys(ATTACKS, "denied"), who
    assert not ETC_PROBE.exists()
    assert (outside / "victim.txt").read_text() == "not yours\n"
    assert sorted(p.name for p in home.iterdir()) == [".ssh"]


def test_without_the_sandbox_every_attack_succeeds(repo: Path, home: Path, outside: Path) -> None:
    """The control: the same agent, mode off, does every one of them."""
    results = _attack(repo, home, outside, "off")
    for who, result in results.items():
        assert result == dict.fromkeys(ATTACKS, "allowed"), who


def test_a_kernel_without_landlock_starts_no_sandboxed_run(
    repo: Path, home: Path, outside: Path
) -> None:
    """``[daemon] landlock_abi = 0`` stands for such a kernel: the run never starts, and
    the task says why. It never runs unconfined."""
    _config(repo, outside, "workspace")
    with (repo / ".grid" / "config.toml").open("a") as config:
        config.write("\n[daemon]\nlandlock_abi = 0\n")
    with core_daemon(repo, env={"HOME": str(home)}) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "boxed", "title": "attacks", "maxAttempts": 1})
        c.post("/session/start", {"maxAgents": 1})
        task = wait_task_status(c, "boxed", "failed", timeout=30)
        assert str(task["error"]).startswith("could not start the agent: sandbox_unavailable:")
        assert "needs Landlock" in str(task["error"])
        (agent,) = c.get("/agents", params={"all": "1"})
        assert agent["pid"] is None
        assert not (Path(agent["runDir"]) / "agent.json").exists()
    assert not list(outside.glob("x-*"))


def test_a_sandboxed_run_survives_a_daemon_restart_with_its_sandbox_intact(
    repo: Path, home: Path, outside: Path
) -> None:
    """The agent was bound by the kernel before the daemon went: the restarted daemon
    reattaches the same shim and agent, and the agent's attacks are still refused."""
    _config(repo, outside, "workspace", wait=True)
    try:
        with restartable_daemon(repo, env={"HOME": str(home)}) as grid:
            c = grid.client()
            _start(c)

            def boxed_agent() -> dict[str, object] | None:
                found = [a for a in c.get("/agents") if a["taskId"] == "boxed" and a["pid"]]
                return found[0] if found else None

            before = wait_for(boxed_agent, timeout=30, message="the sandboxed agent to run")
            run_dir = Path(before["runDir"])
            wait_for(
                lambda: "waiting" in (run_dir / "output.log").read_text(),
                timeout=30,
                message="the agent to wait",
            )
            grid.kill9()
            grid.start()
            after = wait_for(boxed_agent, timeout=30, message="the agent reattached")
            assert (after["pid"], after["shimPid"]) == (before["pid"], before["shimPid"])
            assert after["sandbox"] == before["sandbox"]
            (Path(after["worktreePath"]) / "go").touch()
            wait_task_status(c, "boxed", "review", timeout=60)
            results = {
                who: json.loads(git_show(repo, f"grid/boxed:{who}.json") or "{}")
                for who in ("attacks", "grandchild")
            }
    finally:
        ETC_PROBE.unlink(missing_ok=True)
    for who, result in results.items():
        assert result == dict.fromkeys(ATTACKS, "denied"), who


def test_doctor_says_what_this_machine_can_enforce(repo: Path, outside: Path) -> None:
    """The Landlock ABI, and the profiles in a sandbox; on a kernel without Landlock (the
    daemon's seam, which doctor honours too) a sandboxed profile is a failure to fix."""
    _config(repo, outside, "workspace")
    env = {**os.environ, "COLUMNS": "300"}
    found = gridctl(repo, "doctor", "--json", env=env)
    checks = {c["check"]: c for c in json.loads(found.stdout)}
    sandbox = checks["sandbox"]
    assert sandbox["verdict"] == "ok"
    assert sandbox["detail"].startswith(f"Landlock ABI {landlock.abi_version()}:")
    assert "sandboxed: boxed (workspace)" in sandbox["detail"]
    with (repo / ".grid" / "config.toml").open("a") as config:
        config.write("\n[daemon]\nlandlock_abi = 0\n")
    found = gridctl(repo, "doctor", "--json", env=env)
    assert found.returncode == 1
    sandbox = {c["check"]: c for c in json.loads(found.stdout)}["sandbox"]
    assert sandbox["verdict"] == "fail"
    assert "no Landlock" in sandbox["detail"] and "boxed (workspace)" in sandbox["detail"]
    assert 'mode = "off"' in sandbox["fix"]


READ_ONLY_PROBE = (
    'touch mine 2>/dev/null && echo "worktree: written" || echo "worktree: refused";'
    ' t=$(mktemp) && echo "tmpdir: written" && rm -f "$t";'
    ' cat "$HOME/.ssh/id_test" >/dev/null 2>&1 && echo "key: read" || echo "key: refused"'
)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("read-only", ["worktree: refused", "tmpdir: written", "key: refused"]),
        ("off", ["worktree: written", "tmpdir: written", "key: read"]),
    ],
)
def test_a_read_only_sandbox_writes_only_its_tmpdir(
    repo: Path, home: Path, mode: str, expected: list[str]
) -> None:
    write_core_config(
        repo,
        agents={
            "probe": {"command": ["/bin/sh", "-c", READ_ONLY_PROBE], "sandbox": {"mode": mode}}
        },
        scheduler={"default_agent": "probe"},
    )
    with core_daemon(repo, env={"HOME": str(home)}) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "probe", "title": "probe", "maxAttempts": 1})
        c.post("/session/start", {"maxAgents": 1})
        wait_for(
            lambda: c.get("/tasks/probe")["status"] in ("review", "failed", "done"),
            timeout=30,
            message="the probe to end",
        )
        (agent,) = c.get("/agents", params={"all": "1"})
        output = (Path(agent["runDir"]) / "output.log").read_text()
    assert output.split("\n")[:3] == expected, output


def test_a_claude_profile_writes_its_own_state_by_default(tmp_path: Path) -> None:
    """The policy, without a process: the claude adapter's ~/.claude and ~/.claude.json are
    writable unless the profile lists its own; ``.grid/`` is hidden whatever it lists."""
    from gridd.runs.sandbox import sandbox_for
    from gridd.settings import SandboxSettings

    home, grid = tmp_path / "home", tmp_path / "repo" / ".grid"
    worktree, run_dir = grid / "worktrees" / "t1", grid / "runs" / "claude-1"
    settings = SandboxSettings(mode="workspace", hidden=["~/.ssh"])
    box = sandbox_for(
        settings, adapter="claude", worktree=worktree, run_dir=run_dir, grid_dir=grid, home=home
    )
    assert box is not None
    assert box.writable == (
        str(worktree),
        str(run_dir / "tmp"),
        str(home / ".claude"),
        str(home / ".claude.json"),
    )
    assert box.hidden == (str(home / ".ssh"), str(grid))
    listed = SandboxSettings(mode="read-only", writable=["~/.cache/x", "build"], hidden=[])
    box = sandbox_for(
        listed, adapter="claude", worktree=worktree, run_dir=run_dir, grid_dir=grid, home=home
    )
    assert box is not None
    assert box.writable == (str(run_dir / "tmp"), str(home / ".cache/x"), str(worktree / "build"))
    assert box.hidden == (str(grid),)
    off = SandboxSettings()
    assert off.mode == "off"
    assert (
        sandbox_for(
            off, adapter="claude", worktree=worktree, run_dir=run_dir, grid_dir=grid, home=home
        )
        is None
    )


def test_a_writable_path_holding_a_hidden_one_is_refused(tmp_path: Path) -> None:
    """Landlock grants a directory with all below it: ``writable = ["~"]`` would make
    ``~/.ssh`` readable, so the run is refused, saying which paths clash."""
    from gridd.errors import GriddError
    from gridd.runs.sandbox import sandbox_for
    from gridd.settings import SandboxSettings

    home, grid = tmp_path / "home", tmp_path / "repo" / ".grid"
    settings = SandboxSettings(mode="workspace", writable=["~"])
    with pytest.raises(GriddError) as refused:
        sandbox_for(
            settings,
            adapter="heartbeat",
            worktree=grid / "worktrees" / "t1",
            run_dir=grid / "runs" / "x-1",
            grid_dir=grid,
            home=home,
        )
    assert refused.value.code == "sandbox_invalid"
    assert f"{home} holds the hidden path {home / '.ssh'}" in refused.value.message


@pytest.mark.parametrize("mode", ["workspace", "off"])
def test_gridds_own_git_never_follows_a_worktree_git_file_the_agent_rewrote(
    repo: Path, outside: Path, mode: str
) -> None:
    """The worktree's ``.git`` file lies in what the agent writes: one pointed at a
    repository the agent made, whose config runs a hook, must not make gridd's git (the
    finish, the radar) run that hook outside the sandbox: gridd's git there is pinned to
    the worktree's own git directory. The finish then refuses the tampered worktree."""
    marker = outside / "hook-ran"
    write_core_config(
        repo,
        agents={
            "swap": {
                "command": agent_command("gitfile_swap.py", str(marker), "4"),
                "sandbox": {"mode": mode},
            }
        },
        scheduler={"default_agent": "swap"},
    )
    with (repo / ".grid" / "config.toml").open("a") as config:
        config.write("\n[merge]\nradar_seconds = 0.3\n")
    main_before = git_show(repo, "main:README.md")
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "swap", "title": "swap", "maxAttempts": 1})
        c.post("/session/start", {"maxAgents": 1})
        blocked = wait_task_status(c, "swap", "blocked", timeout=60)
    assert "no longer the worktree gridd made" in str(blocked["error"]), blocked
    assert not marker.exists(), "gridd's git ran the agent's hook"
    assert git_show(repo, "main:README.md") == main_before
    assert git_show(repo, "main:work.txt") is None


def test_shim_preload_imports_landlock_ahead_of_the_fork() -> None:
    """A shim server (or spare shim) has ``landlock`` loaded before it forks a run's shim:
    imported after the fork, it cost ~2 ms of each sandboxed spawn (``python -I -S``)."""
    here = os.path.dirname(shim.__file__)
    probe = (
        f"import sys; sys.path.insert(0, {here!r}); import shim; shim._preload();"
        " print('landlock' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "True", out
