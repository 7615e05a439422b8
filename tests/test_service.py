"""``gridctl service``: user units written from the packaged templates, verified by systemd
itself, installed once, removed cleanly, and enabled when a user manager answers."""

from __future__ import annotations

import os
import plistlib
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.cli.service_units import launchd_name, systemd_escape_path
from tests.support.cli import gridctl

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def systemd_analyze() -> str:
    """``systemd-analyze``, installed from Debian's ``systemd`` package when missing (as root
    with apt-get; otherwise the verification tests are skipped)."""
    found = shutil.which("systemd-analyze")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "systemd"],
            env=env,
            capture_output=True,
            timeout=900,
        )
        found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze is not installed (Debian package 'systemd')")
    return found


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def service(
    repo: Path, home: Path, *args: str, path: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "PATH": path if path is not None else os.environ["PATH"],
    }
    env.pop("XDG_RUNTIME_DIR", None)
    env.pop("DBUS_SESSION_BUS_ADDRESS", None)
    return gridctl(repo, "--no-start", "service", *args, env=env)


def unit_path(repo: Path, home: Path) -> Path:
    return home / ".config" / "systemd" / "user" / f"gridd@{systemd_escape_path(repo)}.service"


def test_install_writes_a_unit_that_systemd_analyze_verifies(
    repo: Path, home: Path, tmp_path: Path, systemd_analyze: str
) -> None:
    result = service(repo, home, "install")
    assert result.returncode == 0, result.stderr
    path = unit_path(repo, home)
    assert f"wrote {path}" in result.stdout
    # No user manager here: the unit is written, and the way to enable it is printed.
    assert "no systemd user manager is reachable" in result.stdout
    assert f"systemctl --user enable --now {path.name}" in result.stdout
    text = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    for line in (
        "LimitNOFILE=65536",
        "Restart=on-failure",
        "KillMode=process",
        "StandardError=journal",
    ):
        assert line in text
    assert "ExecStart=" in text and "%h/.local/bin/gridd" not in text
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    verify = subprocess.run(
        [systemd_analyze, "--user", "verify", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime), "HOME": str(home)},
        timeout=60,
    )
    assert verify.returncode == 0, verify.stderr
    assert verify.stderr.strip() == "", verify.stderr  # not even a warning


def test_install_refuses_to_install_twice(repo: Path, home: Path) -> None:
    assert service(repo, home, "install").returncode == 0
    before = unit_path(repo, home).read_text()
    again = service(repo, home, "install")
    assert again.returncode == 1
    assert "already installed" in again.stderr
    assert "gridctl service uninstall" in again.stderr
    assert unit_path(repo, home).read_text() == before


def test_uninstall_removes_the_unit_and_status_follows(repo: Path, home: Path) -> None:
    assert service(repo, home, "status").returncode == 1
    assert service(repo, home, "install").returncode == 0
    status = service(repo, home, "status")
    assert status.returncode == 0
    assert f"installed: {unit_path(repo, home)}" in status.stdout
    assert "differs" not in status.stdout
    removed = service(repo, home, "uninstall")
    assert removed.returncode == 0, removed.stderr
    assert f"removed {unit_path(repo, home)}" in removed.stdout
    assert not unit_path(repo, home).exists()
    nothing = service(repo, home, "uninstall")
    assert nothing.returncode == 1
    assert "no systemd service is installed" in nothing.stderr


def test_with_a_user_manager_install_enables_and_starts_the_unit(
    repo: Path, home: Path, tmp_path: Path
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "systemctl.log"
    fake = bindir / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit 0\n')
    fake.chmod(0o755)
    result = service(repo, home, "install", path=f"{bindir}:{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr
    name = unit_path(repo, home).name
    assert f"enabled and started: systemctl --user enable --now {name}" in result.stdout
    assert log.read_text().splitlines() == [
        "--user daemon-reload",
        f"--user enable --now {name}",
    ]
    removed = service(repo, home, "uninstall", path=f"{bindir}:{os.environ['PATH']}")
    assert removed.returncode == 0
    assert f"--user disable --now {name}" in log.read_text()


@pytest.mark.skipif(shutil.which("systemd-escape") is None, reason="no systemd-escape")
@pytest.mark.parametrize("path", ["/tmp/my-repo", "/home/me/src/a b/c.d", "/srv/.hidden/ü_x:1"])
def test_unit_names_escape_paths_as_systemd_does(path: str) -> None:
    expected = subprocess.run(
        ["systemd-escape", "--path", path], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert systemd_escape_path(Path(path)) == expected


def test_launchd_agent_is_a_valid_plist_for_this_workspace(repo: Path, home: Path) -> None:
    result = service(repo, home, "install", "--manager", "launchd")
    assert result.returncode == 0, result.stderr
    label = f"dev.gridd.{launchd_name(repo)}"
    path = home / "Library" / "LaunchAgents" / f"{label}.plist"
    assert f"wrote {path}" in result.stdout
    assert "launchctl bootstrap" in result.stdout  # no launchd here: says how to load it
    plist = plistlib.loads(path.read_bytes())
    assert plist["Label"] == label
    assert plist["ProgramArguments"][-3:] == ["--foreground", "--workspace", str(repo)]
    assert plist["WorkingDirectory"] == str(repo)
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["SoftResourceLimits"]["NumberOfFiles"] == 65536
    assert plist["AbandonProcessGroup"] is True
    assert "__" not in path.read_text()


def test_contrib_units_are_the_packaged_templates() -> None:
    for contrib, packaged in [
        ("contrib/systemd/gridd@.service", "gridd/units/gridd@.service"),
        ("contrib/launchd/dev.gridd.plist", "gridd/units/dev.gridd.plist"),
    ]:
        assert (REPO_ROOT / contrib).resolve() == (REPO_ROOT / packaged).resolve()


def test_print_shows_the_unit_without_writing_it(repo: Path, home: Path) -> None:
    result = service(repo, home, "install", "--print")
    assert result.returncode == 0
    assert "[Service]" in result.stdout
    assert not unit_path(repo, home).exists()


@pytest.fixture(autouse=True)
def _no_daemon_left(repo: Path) -> Iterator[None]:
    yield
    assert not (repo / ".grid" / "gridd.sock").exists()
