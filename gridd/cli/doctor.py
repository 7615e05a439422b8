"""``gridctl doctor``: is this machine and workspace fit to run gridd? A verdict and a fix
for each check; exit 1 when something needs action (any ``fail``), 0 otherwise.

It never starts the daemon and changes nothing: it reads files, runs ``--version`` of the
programs the configuration names, opens the database read-only and asks ``/health`` if a
daemon answers. The checks themselves are in ``doctor_checks``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

from gridd.cli import daemonctl
from gridd.cli.context import EXIT_ERROR, EXIT_OK, Command, Context
from gridd.cli.doctor_checks import (
    Check,
    check_binaries,
    check_disk,
    check_fd_limit,
    check_git,
    check_grid_dir,
    check_sandbox,
    check_seatbelt,
    check_socket,
    check_trust,
)
from gridd.client import GridClient
from gridd.errors import GriddError
from gridd.lockholder import describe, flock_holder
from gridd.runs import landlock, seatbelt
from gridd.settings import Settings, builtin_profiles, load_settings
from gridd.workspace import Workspace, find_workspace

MARKS = {"ok": "  ok ", "warn": " warn", "fail": " FAIL"}


def sandboxed_profiles(settings: Settings) -> dict[str, str]:
    """profile -> sandbox mode, of the profiles in a sandbox."""
    profiles = settings.profiles().items()
    return {name: p.sandbox.mode for name, p in profiles if p.sandbox.mode != "off"}


def configured_commands(settings: Settings, root: Path) -> dict[str, list[str]]:
    """config key -> argv of every program gridd may run for this workspace."""
    commands: dict[str, list[str]] = {}
    profiles = settings.profiles()
    default = settings.scheduler.default_agent
    builtins = builtin_profiles()
    for name, profile in profiles.items():
        # A configured table that only changes a built-in profile (its sandbox) names no
        # program: 'claude' is checked once it is the default, as without the table.
        builtin = builtins.get(name)
        named = name in settings.agents and (builtin is None or builtin.command != profile.command)
        if named or name == default:
            commands[f"agents.{name}.command"] = profile.command
    beads = settings.beads
    if beads.enabled or (beads.enabled is None and (root / ".beads").is_dir()):
        commands["beads.command"] = beads.command
    if settings.notifications.command:
        commands["notifications.command"] = settings.notifications.command
    return commands


def lock_holder(lock: Path) -> int | None:
    """The pid holding ``flock`` on ``lock`` (from /proc/locks), else whether it is held
    at all (a non-blocking try, released at once: pid 0 means "held, holder unknown")."""
    if not lock.exists():
        return None
    with contextlib.suppress(OSError):
        return flock_holder(lock)
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    finally:
        os.close(fd)
    return None


def check_pid_and_lock(ws: Workspace, answering_pid: int | None) -> list[Check]:
    checks = []
    pid = daemonctl._read_pid(ws.pid_path)
    holder = lock_holder(ws.lock_path)
    if pid is not None and pid != answering_pid:
        if daemonctl._process(pid) is None:
            checks.append(
                Check(
                    "pid file",
                    "warn",
                    f"{ws.pid_path} names pid {pid}, which is"
                    " not running: left by a daemon that was killed",
                    f"harmless (overwritten at the next start); rm {ws.pid_path}",
                )
            )
        elif holder != pid and not daemonctl._looks_like_gridd(pid):
            # The daemon that wrote it is gone and its pid went to another program.
            checks.append(
                Check(
                    "pid file",
                    "warn",
                    f"{ws.pid_path} names pid {pid}, now {describe(pid)}: not a gridd (the"
                    " daemon that wrote it has ended; its pid was reused)",
                    f"harmless (overwritten at the next start); rm {ws.pid_path}",
                )
            )
        else:
            checks.append(
                Check(
                    "pid file",
                    "fail",
                    f"{ws.pid_path} names live pid {pid}"
                    f" ({describe(pid)}), which does not answer on the socket",
                    f"a hung or starting gridd: see {ws.log_path}; kill {pid}",
                )
            )
    else:
        checks.append(Check("pid file", "ok", "none, or the answering daemon's"))
    if holder is None or holder == answering_pid:
        checks.append(Check("lock", "ok", "free, or held by the answering daemon"))
    else:
        who = f"pid {holder} ({describe(holder)})" if holder else "another process"
        checks.append(
            Check(
                "lock",
                "fail",
                f"{ws.lock_path} is held by {who}, but no daemon"
                " answers on the socket: gridd cannot start here",
                f"a hung or starting gridd: see {ws.log_path}"
                + (f"; kill {holder}" if holder else ""),
            )
        )
    return checks


def check_links(ws: Workspace) -> Check:
    """The daemon's own refusal of symbolic links among the files it writes under
    ``.grid/`` (``Workspace.refuse_symlinks``), found before it refuses to start."""
    try:
        ws.refuse_symlinks()
    except GriddError as exc:
        path = exc.details.get("path") if isinstance(exc.details, dict) else None
        return Check("links", "fail", exc.message, f"rm {path}" if path else "see the message")
    return Check("links", "ok", "no symbolic link among the files gridd writes")


def check_database(ws: Workspace) -> Check:
    """Asks the installed ``gridd --check-state`` (read-only), as an upgrade does: the
    client side never opens the daemon's database code itself."""
    try:
        result = daemonctl.run_gridd_check(ws, "--check-state", timeout=120)
        report = json.loads(result.stdout)
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        return Check(
            "database",
            "fail",
            f"gridd --check-state did not answer: {exc}",
            "run it by hand: gridd --check-state",
        )
    if report.get("problem"):
        newer = (report.get("schema") or 0) > report.get("supported_schema", 0)
        fix = (
            "upgrade gridd (the database was written by a newer one)"
            if newer
            else "stop gridd and start it again: it moves an unreadable database aside"
            " (gridd.db.corrupt-<time>) and starts afresh; see docs/operations.md"
        )
        return Check("database", "fail", str(report["problem"]), fix)
    if not report.get("exists"):
        return Check("database", "ok", "no database yet (created at first start)")
    with contextlib.suppress(OSError):
        if ws.db_path.stat().st_size == 0:
            return Check(
                "database",
                "warn",
                f"{ws.db_path} is empty (0 bytes): it holds no state",
                "if gridd had a database here, its state is lost: the next start keeps the"
                " empty file aside and starts afresh (see docs/operations.md, recovery)",
            )
    counts = ", ".join(f"{v} {k}" for k, v in report.get("counts", {}).items())
    return Check(
        "database",
        "ok",
        f"quick_check ok, schema {report.get('schema')}"
        f" (this gridd: {report.get('supported_schema')}); {counts}",
    )


def check_daemon(ws: Workspace) -> tuple[Check, int | None]:
    status = daemonctl.probe(ws)
    if status is None:
        return Check("daemon", "ok", "not running (gridctl starts it on demand)"), None
    with contextlib.suppress(GriddError), GridClient(ws.socket_path, timeout=5) as client:
        health = client.get("/health")
        if health.get("status") != "ok":
            return Check(
                "daemon",
                "warn",
                f"pid {status.pid} answers but is {health.get('status')}: "
                + "; ".join(
                    [
                        f"{p} is {health.get('parts', {}).get(p, 'down')}"
                        for p in health.get("degraded", [])
                    ]
                    + list(health.get("warnings", []))
                ),
                f"see {ws.log_path}",
            ), status.pid
    return Check("daemon", "ok", f"running: pid {status.pid}, gridd {status.version}"), status.pid


def run_checks(ws: Workspace, environ: dict[str, str]) -> list[Check]:
    daemon, pid = check_daemon(ws)
    checks = [check_git(environ)]
    try:
        settings = load_settings(ws.config_path)
    except GriddError as exc:
        checks.append(Check("config", "fail", exc.message, f"fix {ws.config_path}"))
    else:
        checks += check_binaries(configured_commands(settings, ws.root), environ)
        abi = landlock.usable_abi(settings.daemon.landlock_abi)
        networks = {n: p.sandbox.network for n, p in settings.profiles().items()}
        fenced: dict[str, str] = {n: net for n, net in networks.items() if net != "allow"}
        if seatbelt.applies():
            why = seatbelt.unavailable("workspace")
            checks.append(check_seatbelt(sandboxed_profiles(settings), why))
        else:
            checks.append(check_sandbox(sandboxed_profiles(settings), abi, fenced))
    checks.append(check_trust(ws.root, ws.config_path, environ))
    checks.append(check_grid_dir(ws.grid_dir, os.getuid()))
    checks.append(check_links(ws))
    checks.append(check_socket(ws.socket_path, os.getuid(), answering=pid is not None))
    checks += check_pid_and_lock(ws, pid)
    checks.append(check_disk(ws.grid_dir if ws.grid_dir.exists() else ws.root))
    checks.append(check_fd_limit(pid))
    checks.append(check_database(ws))
    checks.append(daemon)
    return checks


def build_doctor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks as a JSON list")


def run_doctor(ctx: Context) -> int:
    ws = find_workspace(ctx.args.workspace)
    checks = run_checks(ws, dict(os.environ))
    failed = [c for c in checks if c.verdict == "fail"]
    if ctx.args.json:
        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        print(f"gridd doctor for {ws.root}")
        for check in checks:
            print(f"[{MARKS[check.verdict]}] {check.name}: {check.detail}")
            if check.fix and check.verdict != "ok":
                print(f"         fix: {check.fix}")
        warned = sum(c.verdict == "warn" for c in checks)
        summary = f"{len(checks)} checks: {len(failed)} need action, {warned} warning(s)"
        print(summary if failed else f"{summary}; nothing needs action")
    sys.stdout.flush()
    return EXIT_ERROR if failed else EXIT_OK


DOCTOR = Command(
    help="check git, agent binaries, permissions, stale pid/lock, trust, disk, fd limit,"
    " database and daemon; exit 1 when something needs action",
    description="Check that this machine and workspace can run gridd, with a verdict (ok,"
    " warn, FAIL) and a fix for each: git >= 2.38, the programs the config names (claude,"
    " bd, ...) and their versions, .grid/ and socket permissions, a stale pid file or a"
    " held lock with no daemon, the config's trust, free disk, the open-files limit, the"
    " database (read-only quick_check and schema) and the daemon's health. It never starts"
    " the daemon or changes anything. Exit status 1 when any check FAILs.",
    build=build_doctor,
    run=run_doctor,
)
