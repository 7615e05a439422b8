"""Seatbelt: the macOS sandbox (``sandbox-exec``), from the same settings as Landlock.

On macOS a run's sandbox (the spec's ``sandbox``, built by ``runs/sandbox.py`` exactly as on
Linux) becomes an SBPL profile (``profile``: a pure function of it), and the shim executes
the agent as ``/usr/bin/sandbox-exec -p PROFILE ARGV...`` (``command``): the kernel applies
the profile at that ``exec`` and it binds the agent and everything it starts.

UNTESTED ON A REAL MAC: gridd's suite runs on Linux; the tests here check the profile's text
only. Apple calls ``sandbox-exec`` deprecated, yet Codex CLI and Anthropic's sandbox-runtime
rely on it too.

The profile denies by default and then only allows, never denying after an allow, so no
rule's precedence matters: every exclusion is spelled inside its allow (``require-not``).

- Files: read everywhere but the ``hidden`` paths; read and write beneath the ``writable``
  ones (the worktree in ``workspace`` mode, ``TMPDIR``, the CLI's own state); read and write
  the ``appendable`` files (the run's output log and heartbeat file: Seatbelt cannot tell
  an append from a truncation, unlike Landlock); the usual devices.
- Processes: fork and exec; signals and process information only within the sandbox.
- Mach and IPC: the few services a command-line program needs (name and user lookups,
  TLS trust, the keychain where Claude Code keeps its login, logging, DNS and proxy
  configuration), POSIX shared memory and semaphores, pseudo-terminals.
- Network: ``allow``: all of it. ``none``: no TCP or UDP, and no Unix socket but the
  system's name resolver. ``allowlist``: the same plus a TCP connection to the run's proxy
  on ``localhost`` (its one port), which lets through only the allowed hosts.

Not the same as on Linux: there is no ``no_new_privs`` (a setuid program runs setuid, still
inside the sandbox), and Unix sockets are closed but for the resolver (Landlock leaves them
alone; on Linux the daemon refuses a sandboxed client itself).

Standard library only, like the shim that loads it (``runs/shim.py`` runs as ``python -I -S``).
"""

from __future__ import annotations

import os
import sys

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
#: Devices every program expects to write (or ioctl), whatever the sandbox.
DEVICES = ("/dev/null", "/dev/zero", "/dev/tty", "/dev/ptmx", "/dev/dtracehelper", "/dev/fd")
#: The pseudo-terminals a program may be given (``/dev/ttys000``...).
TTYS = r"^/dev/ttys[0-9]+$"
#: The system's name resolver: DNS lookups go through it, over a Unix socket.
RESOLVER = "/private/var/run/mDNSResponder"
#: Mach services a command-line program needs: user and group lookups, TLS certificate
#: trust, the keychain (Claude Code's login is there), logging, DNS and proxy settings.
MACH_SERVICES = (
    "com.apple.system.opendirectoryd.libinfo",
    "com.apple.system.opendirectoryd.membership",
    "com.apple.trustd.agent",
    "com.apple.trustd",
    "com.apple.SecurityServer",
    "com.apple.securityd.xpc",
    "com.apple.ocspd",
    "com.apple.logd",
    "com.apple.system.logger",
    "com.apple.system.notification_center",
    "com.apple.SystemConfiguration.DNSConfiguration",
    "com.apple.SystemConfiguration.configd",
    "com.apple.bsd.dirhelper",
    "com.apple.coreservices.launchservicesd",
    "com.apple.lsd.mapdb",
    "com.apple.cfprefsd.daemon",
    "com.apple.cfprefsd.agent",
)
BASE = """\
(version 1)
(deny default)
(allow process-exec)
(allow process-fork)
(allow process-info* (target same-sandbox))
(allow signal (target same-sandbox))
(allow sysctl-read)
(allow user-preference-read)
(allow ipc-posix-shm)
(allow ipc-posix-sem)
(allow pseudo-tty)
"""


def unavailable(mode: str, network: str = "allow") -> str | None:
    """Why this system cannot enforce ``mode`` with ``network`` through Seatbelt (None: it
    can). Every network policy is one it can."""
    del network
    if mode == "off" or os.access(SANDBOX_EXEC, os.X_OK):
        return None
    return f"sandbox mode {mode!r} needs {SANDBOX_EXEC} (macOS Seatbelt); this system has none"


def applies() -> bool:
    """Whether runs here are sandboxed with Seatbelt (macOS) rather than Landlock."""
    return sys.platform == "darwin"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _paths(kind: str, paths: list[str] | tuple[str, ...]) -> str:
    return " ".join(f"({kind} {_quote(p)})" for p in paths)


def _strings(items: object) -> list[str]:
    return [str(i) for i in items] if isinstance(items, (list, tuple)) else []


def profile(sandbox: dict[str, object]) -> str:
    """The SBPL profile of a run's sandbox (the spec's ``sandbox``: ``mode``, ``writable``,
    ``hidden``, ``appendable``, resolved absolute paths; ``network``; ``connect_ports``,
    its proxy's port). Pure: no file is looked at."""
    writable = _strings(sandbox.get("writable"))
    hidden = _strings(sandbox.get("hidden"))
    appendable = _strings(sandbox.get("appendable"))
    network = str(sandbox.get("network", "allow"))
    ports = [int(p) for p in _strings(sandbox.get("connect_ports"))]
    lines = [BASE.rstrip("\n")]
    lines.append(f"(allow mach-lookup {_paths('global-name', MACH_SERVICES)})")
    readable = '(subpath "/")'
    if hidden:
        shut = " ".join(f"(require-not (subpath {_quote(h)}))" for h in hidden)
        readable = f"(require-all {readable} {shut})"
    lines.append(f"(allow file-read* {readable})")
    if writable:
        lines.append(f"(allow file-read* file-write* {_paths('subpath', writable)})")
    if appendable:
        lines.append(f"(allow file-read-data file-write-data {_paths('literal', appendable)})")
    devices = f"{_paths('literal', DEVICES[:-1])} (subpath {_quote(DEVICES[-1])})"
    lines.append(f'(allow file-read* file-write-data file-ioctl {devices} (regex #"{TTYS}"))')
    if network == "allow":
        lines.append("(allow network*)")
        lines.append("(allow system-socket)")
    else:
        lines.append(f"(allow network-outbound (literal {_quote(RESOLVER)}))")
        for port in ports if network == "allowlist" else ():
            lines.append(f'(allow network-outbound (remote tcp "localhost:{port}"))')
    return "\n".join(lines) + "\n"


def command(sandbox: dict[str, object], argv: list[str]) -> list[str]:
    """``argv`` run inside the sandbox: ``sandbox-exec -p PROFILE ARGV...``."""
    return [SANDBOX_EXEC, "-p", profile(sandbox), *argv]
