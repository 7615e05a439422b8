"""What ``gridctl doctor`` checks, one function per concern, each returning ``Check``s.

Decisions are pure (``git_verdict``, ``mode_verdict``, ``grid_dir_verdict``,
``disk_verdict``, ``fd_verdict``); the functions around them look at the machine: git on
PATH, the agent binaries the config names, ``.grid/`` and the socket, the pid and lock
files, trust, disk, fd limits, the database (read-only) and the daemon. Nothing here
changes anything.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gridd import trust

Verdict = Literal["ok", "warn", "fail"]

#: ``git merge-tree --write-tree`` (conflict prediction, the merge queue) needs this.
GIT_MIN = (2, 38)
FD_MIN = 4096
DISK_FAIL_BYTES = 200 * 1024 * 1024
DISK_WARN_BYTES = 2 * 1024 * 1024 * 1024
VERSION_TIMEOUT = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    verdict: Verdict
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.name, "verdict": self.verdict, "detail": self.detail, "fix": self.fix}


def version_of(argv: list[str], environ: dict[str, str]) -> str | None:
    """The first line ``<argv> --version`` prints, or None if it fails."""
    try:
        result = subprocess.run(
            [*argv, "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT,
            env=environ,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (result.stdout or result.stderr).strip().splitlines()
    return lines[0].strip() if result.returncode == 0 and lines else None


# -- pure decisions ------------------------------------------------------------------------------


def parse_git_version(text: str) -> tuple[int, ...] | None:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def git_verdict(version: tuple[int, ...] | None) -> Verdict:
    if version is None:
        return "fail"
    return "ok" if version[:2] >= GIT_MIN else "fail"


def mode_verdict(mode: int, *, allowed: int) -> Verdict:
    """``fail`` when the file grants any permission outside ``allowed``."""
    return "ok" if stat.S_IMODE(mode) & ~allowed == 0 else "fail"


def grid_dir_verdict(mode: int, *, owner: int, uid: int) -> Verdict:
    """``.grid/`` from its ``lstat``: ``fail`` unless it is a directory (not a link) of
    ``uid``'s that no one else may write to; ``warn`` when others may only read or enter it,
    as a clone or a umask of 022 leaves it: gridd tightens it to 0700 itself each time it
    starts (``Workspace.ensure_grid_dir``); ``ok`` at 0700."""
    if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode) or owner != uid:
        return "fail"
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        # Others may have put files there already (a config.toml whose commands gridd would
        # run): tightening the mode later does not take them out.
        return "fail"
    return "ok" if mode_verdict(mode, allowed=0o700) == "ok" else "warn"


def disk_verdict(free: int) -> Verdict:
    return "fail" if free < DISK_FAIL_BYTES else "warn" if free < DISK_WARN_BYTES else "ok"


def fd_verdict(soft: int) -> Verdict:
    return "ok" if soft == resource.RLIM_INFINITY or soft >= FD_MIN else "warn"


# -- the checks ----------------------------------------------------------------------------------


def check_git(environ: dict[str, str]) -> Check:
    git = shutil.which("git", path=environ.get("PATH"))
    if git is None:
        return Check("git", "fail", "git is not on PATH", "install git >= 2.38")
    text = version_of([git], environ) or ""
    version = parse_git_version(text)
    if git_verdict(version) == "ok":
        return Check("git", "ok", f"{text} ({git})")
    return Check(
        "git",
        "fail",
        f"{text or 'git --version failed'} ({git}): gridd needs >= {'.'.join(map(str, GIT_MIN))}"
        " (git merge-tree --write-tree, for merges and conflict prediction)",
        "install a newer git (Debian: backports; macOS: brew install git) and put it first on PATH",
    )


def check_binaries(commands: dict[str, list[str]], environ: dict[str, str]) -> list[Check]:
    """Each program the configuration names: found on PATH, and what --version says."""
    checks = []
    for key, argv in commands.items():
        program = argv[0]
        found = shutil.which(program, path=environ.get("PATH"))
        if found is None:
            checks.append(
                Check(
                    f"binary {os.path.basename(program)}",
                    "fail",
                    f"{key} names {program!r}, which is not on PATH (nor executable)",
                    f"install {program}, or change {key} in .grid/config.toml",
                )
            )
            continue
        version = version_of([found], environ)
        detail = f"{found}" + (f": {version}" if version else " (no --version output)")
        checks.append(Check(f"binary {os.path.basename(program)}", "ok", f"{key}: {detail}"))
    return checks


def check_grid_dir(grid_dir: Path, uid: int) -> Check:
    try:
        st = grid_dir.lstat()
    except FileNotFoundError:
        return Check(".grid/", "ok", f"{grid_dir} does not exist yet (created 0700 at first start)")
    verdict = grid_dir_verdict(st.st_mode, owner=st.st_uid, uid=uid)
    if verdict == "ok":
        return Check(".grid/", "ok", f"{grid_dir} is 0700 and yours")
    mode = oct(stat.S_IMODE(st.st_mode))
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return Check(".grid/", "fail", f"{grid_dir} is not a directory", f"move {grid_dir} away")
    if st.st_uid != uid:
        return Check(
            ".grid/",
            "fail",
            f"{grid_dir} is owned by uid {st.st_uid}, not you ({uid})",
            f"chown -R {uid} {grid_dir}",
        )
    if verdict == "fail":
        return Check(
            ".grid/",
            "fail",
            f"{grid_dir} is {mode}: other users can write in it (a config.toml of theirs, whose"
            " commands gridd would run as you; a database or log of theirs) and reach the"
            " database, logs and agents' environments (API keys). gridd tightens it to 0700"
            " when it starts, but keeps what others may have put there",
            f"chmod 700 {grid_dir}, then check that everything in it is yours: ls -la {grid_dir}",
        )
    return Check(
        ".grid/",
        "warn",
        f"{grid_dir} is {mode}: other users can enter it and read whatever its files let"
        " them (the database, logs, agents' environments). gridd tightens it to 0700 each"
        " time it starts (a running daemon: at its next start)",
        f"chmod 700 {grid_dir}",
    )


def check_socket(sock: Path, uid: int, answering: bool) -> Check:
    try:
        st = sock.lstat()
    except FileNotFoundError:
        return Check("socket", "ok", "no socket (the daemon is not running)")
    if not stat.S_ISSOCK(st.st_mode):
        return Check(
            "socket",
            "fail",
            f"{sock} exists and is not a socket; gridd will not start",
            f"look at it, then remove it: rm {sock}",
        )
    if st.st_uid != uid or mode_verdict(st.st_mode, allowed=0o600) == "fail":
        return Check(
            "socket",
            "fail",
            f"{sock} is {oct(stat.S_IMODE(st.st_mode))}, owner uid {st.st_uid}",
            f"chmod 600 {sock} (gridd binds it 0600; restart the daemon)",
        )
    if not answering:
        return Check(
            "socket",
            "warn",
            f"{sock} is left over: nothing answers on it",
            "harmless: gridd removes a socket nobody listens on when it starts",
        )
    return Check("socket", "ok", f"{sock} is 0600 and yours")


def check_disk(path: Path) -> Check:
    try:
        free = shutil.disk_usage(path).free
    except OSError as exc:
        return Check("disk", "fail", f"cannot read free space of {path}: {exc}", "check the path")
    human = f"{free / 1024**3:.1f} GiB free on the filesystem of {path}"
    verdict = disk_verdict(free)
    if verdict == "ok":
        return Check("disk", "ok", human)
    return Check(
        "disk",
        verdict,
        human + " (worktrees, logs and the database grow here)",
        "free space; old worktrees: git worktree remove .grid/worktrees/<id>",
    )


def check_fd_limit(daemon_pid: int | None) -> Check:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    where = "this shell"
    if daemon_pid is not None:
        try:
            import psutil

            soft = psutil.Process(daemon_pid).rlimit(resource.RLIMIT_NOFILE)[0]
            where = f"the running daemon (pid {daemon_pid})"
        except Exception:  # not on Linux, or the process went away: the shell's limit stands
            pass
    shown = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    if fd_verdict(soft) == "ok":
        return Check("fd limit", "ok", f"{shown} open files for {where}")
    return Check(
        "fd limit",
        "warn",
        f"{shown} open files for {where}: many agents and SSE clients need more (>= {FD_MIN})",
        "ulimit -n 65536 before starting gridd, or 'gridctl service install' (LimitNOFILE=65536)",
    )


def check_trust(root: Path, config: Path, environ: dict[str, str]) -> Check:
    """The daemon's own verdict (``gridd.trust``): a committed config that names commands
    must be trusted by sha256; one written in this clone is the user's own."""
    try:
        verdict = trust.assess(root, config, environ)
    except OSError as exc:
        return Check("config trust", "fail", f"cannot read {config}: {exc}", f"check {config}")
    if verdict.trusted:
        return Check("config trust", "ok", f"{config}: {verdict.reason}")
    return Check(
        "config trust",
        "fail",
        f"{config} is committed, names commands ({', '.join(verdict.commands)}) and is"
        f" {verdict.reason}: gridd will not run them",
        "read it, then: gridctl trust",
    )


def check_seatbelt(modes: dict[str, str], why: str | None) -> Check:
    """macOS: the sandbox is Seatbelt's (``sandbox-exec``; ``why``: why it is missing)."""
    asked = ", ".join(f"{name} ({mode})" for name, mode in sorted(modes.items()))
    if why is None:
        detail = "macOS: sandbox-exec enforces the sandbox (untested by gridd's suite)"
        return Check("sandbox", "ok", detail + (f"; sandboxed: {asked}" if asked else ""))
    if not modes:
        return Check("sandbox", "ok", f"{why}: every run here is unconfined")
    return Check(
        "sandbox",
        "fail",
        f"{why}: runs of {asked} will not start (sandbox_unavailable)",
        'set [agents.<name>.sandbox] mode = "off"',
    )


def check_sandbox(modes: dict[str, str], abi: int, networks: dict[str, str] | None = None) -> Check:
    """What sandboxes this machine can enforce (Landlock's ABI), against the profiles that
    ask for one (``modes``: profile -> sandbox mode, ``off`` ones left out; ``networks``:
    profile -> network policy, ``allow`` ones left out)."""
    asked = ", ".join(f"{name} ({mode})" for name, mode in sorted(modes.items()))
    fenced = ", ".join(f"{name} (network {net})" for name, net in sorted((networks or {}).items()))
    if 1 <= abi < 4 and fenced:
        return Check(
            "sandbox",
            "fail",
            f"Landlock ABI {abi} has no TCP rules (ABI 4, Linux 6.7): runs of {fenced} will"
            " not start (sandbox_unavailable)",
            'run on Linux 6.7 or newer, or set [agents.<name>.sandbox] network = "allow"',
        )
    if abi >= 1:
        gaps = [
            what
            for needed, what in ((3, "truncation"), (5, "device ioctls"), (6, "signals"))
            if abi < needed
        ]
        detail = f"Landlock ABI {abi}: the read-only and workspace sandboxes are enforced"
        if gaps:
            detail += f" (this ABI does not restrict {', '.join(gaps)})"
        detail += (
            "; network none and allowlist too (TCP rules)"
            if abi >= 4
            else "; network none and allowlist are not (no TCP rules before ABI 4)"
        )
        detail += f"; sandboxed: {asked}" if asked else ""
        return Check("sandbox", "ok", detail + (f"; {fenced}" if fenced else ""))
    missing = "no Landlock (Linux 5.13 or newer, with landlock in the kernel's lsm= list)"
    if not modes:
        return Check(
            "sandbox",
            "ok",
            f"{missing}: every run here is unconfined (a profile asking for a sandbox would not"
            " start; 'gridctl init' leaves the claude profile's commented out)",
        )
    return Check(
        "sandbox",
        "fail",
        f"{missing}: runs of {asked} will not start (sandbox_unavailable)",
        'run on a kernel with Landlock, or set [agents.<name>.sandbox] mode = "off"',
    )
