"""``gridctl service install|uninstall|status``: this workspace's daemon as a user service.

A systemd user unit on Linux, a launchd agent on macOS, written from the packaged templates
(``service_units``). No root: everything goes under the user's own directories. When no
user manager answers (a container, an ssh session without lingering), ``install`` still
writes the file and prints the commands that enable it, instead of failing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gridd import __version__
from gridd.cli import daemonctl
from gridd.cli.context import EXIT_ERROR, EXIT_OK, Command, Context, group
from gridd.cli.service_units import UnitFile, render_launchd, render_systemd
from gridd.errors import GriddError
from gridd.workspace import Workspace

MANAGERS = ("systemd", "launchd")
COMMAND_TIMEOUT = 30.0


@dataclass(frozen=True)
class Manager:
    """Where a manager's unit files live and how to drive it."""

    name: str
    directory: Path
    environ: dict[str, str]

    def run(self, *argv: str) -> subprocess.CompletedProcess[str] | None:
        """Run a manager command; None when the tool is not installed."""
        tool = shutil.which(argv[0], path=self.environ.get("PATH", os.defpath))
        if tool is None:
            return None
        try:
            return subprocess.run(
                [tool, *argv[1:]],
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
                env=self.environ,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(list(argv), 1, "", str(exc))


def default_manager() -> str:
    return "launchd" if sys.platform == "darwin" else "systemd"


def manager_for(name: str, environ: dict[str, str]) -> Manager:
    home = Path(environ.get("HOME") or Path.home())
    if name == "launchd":
        return Manager(name, home / "Library" / "LaunchAgents", environ)
    config = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    return Manager(name, config / "systemd" / "user", environ)


def gridd_command() -> list[str]:
    """The gridd that the unit should run: beside this Python, else on PATH, else -m."""
    beside = Path(sys.executable).parent / "gridd"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("gridd")
    if found:
        return [str(Path(found).resolve())]
    return [sys.executable, "-m", "gridd.cli.gridd_main"]


def render(manager: Manager, ws: Workspace) -> UnitFile:
    gridd = gridd_command()
    if manager.name == "launchd":
        home = Path(manager.environ.get("HOME") or Path.home())
        return render_launchd(root=ws.root, gridd=gridd, home=home, version=__version__)
    bindir = str(Path(gridd[0]).parent)
    path = manager.environ.get("PATH", os.defpath)
    if bindir not in path.split(os.pathsep):
        path = os.pathsep.join([bindir, path])
    return render_systemd(root=ws.root, gridd=gridd, path_env=path, version=__version__)


def _how_to_enable(manager: Manager, unit: UnitFile, path: Path) -> list[str]:
    if manager.name == "launchd":
        return [f"launchctl bootstrap gui/{os.getuid()} {shlex.quote(str(path))}"]
    return [
        "systemctl --user daemon-reload",
        f"systemctl --user enable --now {shlex.quote(unit.label)}",
        'loginctl enable-linger "$USER"   # optional: run while logged out, start at boot',
    ]


def _failure(result: subprocess.CompletedProcess[str] | None, tool: str) -> str:
    if result is None:
        return f"{tool} is not installed"
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"{tool} exited with status {result.returncode}"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _stop_unmanaged(ws: Workspace) -> None:
    """A daemon started by gridctl would hold the workspace lock the unit needs."""
    status = daemonctl.probe(ws)
    if status is not None:
        daemonctl.stop(ws)
        print(
            f"stopped the gridd started outside the unit (pid {status.pid});"
            " its agents keep running and the unit's daemon reattaches to them"
        )


def install(ctx: Context) -> int:
    args, ws = ctx.args, ctx.workspace
    manager = manager_for(args.manager, dict(os.environ))
    unit = render(manager, ws)
    if args.print:
        print(unit.text, end="")
        return EXIT_OK
    path = manager.directory / unit.filename
    if path.exists():
        raise GriddError(
            f"a {manager.name} service for {ws.root} is already installed: {path};"
            " remove it first with 'gridctl service uninstall'",
            code="service_installed",
            details={"path": str(path)},
        )
    _write(path, unit.text)
    print(f"wrote {path}")
    print(
        f"  {manager.name} unit {unit.label}: runs {' '.join(gridd_command())} --foreground"
        f" --workspace {ws.root}; restarts on failure; LimitNOFILE 65536;"
        f" logs to {'the journal' if manager.name == 'systemd' else '~/Library/Logs'}"
        f" and {ws.log_path}"
    )
    if args.no_enable:
        print("not enabled (--no-enable). To enable it:")
        for line in _how_to_enable(manager, unit, path):
            print(f"  {line}")
        return EXIT_OK
    if manager.name == "systemd":
        reload = manager.run("systemctl", "--user", "daemon-reload")
        reachable = reload is not None and reload.returncode == 0
    else:
        probe = manager.run("launchctl", "print", f"gui/{os.getuid()}")
        reachable = probe is not None and probe.returncode == 0
        reload = probe
    if not reachable:
        tool = "systemctl" if manager.name == "systemd" else "launchctl"
        print(
            f"no {manager.name} user manager is reachable ({_failure(reload, tool)}):"
            " the unit is written but not enabled. In a session with a user manager, run:"
        )
        for line in _how_to_enable(manager, unit, path):
            print(f"  {line}")
        return EXIT_OK
    _stop_unmanaged(ws)
    if manager.name == "systemd":
        result = manager.run("systemctl", "--user", "enable", "--now", unit.label)
        command = f"systemctl --user enable --now {unit.label}"
    else:
        result = manager.run("launchctl", "bootstrap", f"gui/{os.getuid()}", str(path))
        command = f"launchctl bootstrap gui/{os.getuid()} {path}"
    if result is None or result.returncode != 0:
        print(
            f"gridctl: '{command}' failed: {_failure(result, command.split()[0])};"
            f" the unit file stays at {path}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    print(f"enabled and started: {command}")
    return EXIT_OK


def uninstall(ctx: Context) -> int:
    ws = ctx.workspace
    manager = manager_for(ctx.args.manager, dict(os.environ))
    unit = render(manager, ws)
    path = manager.directory / unit.filename
    if not path.exists():
        raise GriddError(
            f"no {manager.name} service is installed for {ws.root} (looked for {path})",
            code="service_not_installed",
            details={"path": str(path)},
        )
    if manager.name == "systemd":
        result = manager.run("systemctl", "--user", "disable", "--now", unit.label)
        if result is not None and result.returncode == 0:
            print(f"disabled and stopped {unit.label} (agents keep running)")
        wants = manager.directory / "default.target.wants" / unit.filename
        if wants.is_symlink():
            wants.unlink()
            print(f"removed {wants}")
    else:
        result = manager.run("launchctl", "bootout", f"gui/{os.getuid()}", str(path))
        if result is not None and result.returncode == 0:
            print(f"unloaded {unit.label} (agents keep running)")
    path.unlink()
    print(f"removed {path}")
    if manager.name == "systemd":
        manager.run("systemctl", "--user", "daemon-reload")
    print("gridctl starts the daemon on demand again ('gridctl daemon start').")
    return EXIT_OK


def status(ctx: Context) -> int:
    ws = ctx.workspace
    manager = manager_for(ctx.args.manager, dict(os.environ))
    unit = render(manager, ws)
    path = manager.directory / unit.filename
    if not path.exists():
        print(f"not installed: no {manager.name} service for {ws.root} ({path})")
        return EXIT_ERROR
    current = path.read_text(encoding="utf-8")
    print(f"installed: {path} ({unit.label})")
    if current != unit.text:
        print(
            "  differs from what 'install' would write now (gridd moved or was upgraded?):"
            " uninstall and install again to refresh it"
        )
    if manager.name == "systemd":
        enabled = manager.run("systemctl", "--user", "is-enabled", unit.label)
        active = manager.run("systemctl", "--user", "is-active", unit.label)
        if enabled is None or active is None:
            print("  systemctl is not installed: cannot ask systemd about it")
        elif not active.stdout.strip():
            print(
                f"  enabled: {enabled.stdout.strip() or 'unknown'}; no systemd user manager"
                f" is reachable ({_failure(active, 'systemctl')})"
            )
        else:
            print(f"  enabled: {enabled.stdout.strip()}; active: {active.stdout.strip()}")
    else:
        shown = manager.run("launchctl", "print", f"gui/{os.getuid()}/{unit.label}")
        loaded = shown is not None and shown.returncode == 0
        print(f"  loaded: {'yes' if loaded else 'no'}")
    running = daemonctl.probe(ws)
    print(f"  daemon: {f'running, pid {running.pid}' if running else 'not running'}")
    return EXIT_OK


def _manager_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--manager",
        choices=MANAGERS,
        default=default_manager(),
        help=f"the service manager (default here: {default_manager()})",
    )


def _build_install(parser: argparse.ArgumentParser) -> None:
    _manager_option(parser)
    parser.add_argument("--print", action="store_true", help="print the unit, write nothing")
    parser.add_argument(
        "--no-enable", action="store_true", help="write the unit but do not enable or start it"
    )


SERVICE = group(
    "install, remove or inspect this workspace's daemon as a user service (systemd/launchd)",
    {
        "install": Command(
            help="write and enable a user service running this workspace's gridd",
            description="Write a systemd user unit (~/.config/systemd/user/gridd@<path>.service)"
            " or a launchd agent (~/Library/LaunchAgents/dev.gridd.<name>.plist) from gridd's"
            " templates, with the gridd found beside this gridctl, then enable and start it."
            " Refuses when one is installed. Without a reachable user manager it writes the"
            " file and prints how to enable it. No root needed.",
            build=_build_install,
            run=install,
        ),
        "uninstall": Command(
            help="disable, stop and remove this workspace's user service (agents keep running)",
            build=_manager_option,
            run=uninstall,
        ),
        "status": Command(
            help="say whether a user service is installed, enabled and running (exit 1 if not"
            " installed)",
            build=_manager_option,
            run=status,
        ),
    },
    description="Run this workspace's gridd under the user's service manager, to start at"
    " login and come back after a crash. See docs/operations.md.",
)
