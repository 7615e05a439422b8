"""Landlock: the kernel's file-system sandbox, applied to an agent just before ``exec``.

Standard library only, like the shim that loads it (``runs/shim.py`` runs as
``python -I -S``, with nothing of gridd's or of site-packages on its path): the daemon side
builds what a run may do (``runs/sandbox.py``) and writes it into the run's spec; the
shim's child, between ``fork`` and ``exec``, turns it into a Landlock ruleset
(``enforce``). The ruleset binds the agent and everything it ever starts: children,
grandchildren, daemons it leaves behind. ``no_new_privs`` is set first (Landlock needs it
without ``CAP_SYS_ADMIN``, and a setuid binary then gains nothing).

Landlock is an allow-list: every file-system right this kernel knows (its ABI) is denied
except beneath the paths a rule names. "Readable except the hidden paths" is therefore
granted entry by entry: read on every entry of ``/`` that holds no hidden path, and, for an
entry that does, on each of its own entries, down the hidden paths' ancestor chains
(``plan``). The ancestors themselves get only ``READ_DIR``: names inside a hidden directory
can be listed, its files cannot be read. A symbolic link is never followed while planning:
a rule is on an inode, and access through a link is checked at the link's target.

The network (ABI 4): a run whose ``network`` is ``none`` or ``allowlist`` may neither bind
a TCP port nor connect to one, except (``allowlist``) to the port of its own filtering
proxy (``runs/egress.py``), which the daemon runs on loopback. Landlock's TCP rules name a
port, not an address, and cover TCP only (UDP and Unix sockets are not network rights).
"""

from __future__ import annotations

import errno
import os
import stat
import sys

# Syscall numbers: the same on every architecture (the unified table, since Linux 5.13).
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_RULE_NET_PORT = 2
PR_SET_NO_NEW_PRIVS = 38

# File-system rights (``<linux/landlock.h>``); which exist depends on the ABI.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2: link or rename into another directory
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
# Scopes (ABI 6): a sandboxed process cannot signal, nor connect to an abstract Unix
# socket of, a process outside its sandbox (the daemon, other agents, the user's session).
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

# Network rights (ABI 4): TCP only, by port.
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
#: The first ABI with TCP rules (Linux 6.7).
NET_ABI = 4
#: ``network`` values: ``allow`` leaves the network alone; the others need ``NET_ABI``.
NETWORKS = ("allow", "none", "allowlist")

READ = EXECUTE | READ_FILE | READ_DIR
#: Rights that mean something on a file (the others only on a directory).
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
#: Devices every program expects to write (or ioctl), whatever the sandbox.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts", "/dev/shm")
#: The oldest ABI gridd uses: 1 (Linux 5.13). Older ABIs lack rights (REFER, TRUNCATE,
#: IOCTL_DEV) that are then simply not restricted by the kernel: documented, not refused.
MIN_ABI = 1
MODES = ("off", "read-only", "workspace")


class SandboxUnavailable(OSError):
    """This kernel cannot enforce the sandbox asked for; ``str()`` says what is missing."""

    def __str__(self) -> str:
        return str(self.strerror)


def fs_rights(abi: int) -> int:
    """Every file-system right a kernel of Landlock ``abi`` handles."""
    if abi < 1:
        return 0
    rights = (MAKE_SYM << 1) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def scopes(abi: int) -> int:
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def abi_version() -> int:
    """The Landlock ABI this kernel offers (0: none: not Linux, too old, or disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        import ctypes  # here: the daemon imports this module, and needs ctypes rarely

        libc = ctypes.CDLL(None, use_errno=True)
    except (OSError, ImportError):
        return 0
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(
        ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(int(version), 0)


def usable_abi(ceiling: int | None = None) -> int:
    """The ABI gridd may use: the kernel's, capped by ``ceiling`` ([daemon] landlock_abi,
    the test seam that stands for an older kernel, or one without Landlock)."""
    abi = abi_version()
    return abi if ceiling is None else min(abi, ceiling)


def net_rights(network: str, abi: int) -> int:
    """The network rights a run's ruleset handles (denies but where a rule allows)."""
    return NET_BIND_TCP | NET_CONNECT_TCP if network != "allow" and abi >= NET_ABI else 0


def unavailable(mode: str, abi: int, network: str = "allow") -> str | None:
    """Why a kernel of Landlock ``abi`` cannot enforce ``mode`` with ``network`` (None:
    it can)."""
    if mode == "off" or (abi >= MIN_ABI and (network == "allow" or abi >= NET_ABI)):
        return None
    if abi >= MIN_ABI:
        return (
            f"network = {network!r} needs Landlock ABI {NET_ABI} (Linux 6.7 or newer) for its"
            f" TCP rules; this kernel offers ABI {abi}"
        )
    if not sys.platform.startswith("linux"):
        return f"sandbox mode {mode!r} needs Linux Landlock; this system ({sys.platform}) has none"
    return (
        f"sandbox mode {mode!r} needs Landlock (Linux 5.13 or newer, with 'landlock' in the"
        " kernel's lsm= list); this kernel offers none"
    )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def plan(
    *,
    writable: list[str],
    hidden: list[str],
    abi: int,
    appendable: tuple[str, ...] | list[str] = (),
    root: str = "/",
) -> list[tuple[str, int]]:
    """The rules for a sandbox: (path, rights) pairs, read for everything under ``root``
    except the ``hidden`` paths, everything (read included) beneath ``writable`` ones, read
    and write but no truncation of the ``appendable`` files (the run's own output log and
    heartbeat file, reached again through ``/dev/stdout``), and the usual devices. Paths are absolute and resolved; ones that do not exist are left out
    (a hidden path created later is unreadable all the same: no rule covers it)."""
    handled = fs_rights(abi)
    hide = [h for h in hidden if os.path.lexists(h)]
    rules: list[tuple[str, int]] = []

    def grant(path: str, rights: int) -> None:
        try:
            st = os.lstat(path)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):
            return  # its target is covered (or not) by its own rule
        rights &= handled
        if not stat.S_ISDIR(st.st_mode):
            rights &= FILE_RIGHTS
        if rights:
            rules.append((path, rights))

    def walk(directory: str) -> None:
        rules.append((directory, READ_DIR & handled))
        try:
            with os.scandir(directory) as entries:
                found = sorted((e.name, e) for e in entries)
        except OSError:
            return
        if any(_inside(directory, h) for h in hide):
            return  # all of it hidden
        # Only an entry named by a hidden path's next component below ``directory`` can be
        # hidden or hold one: the others (all but a few in a directory such as /tmp) are
        # granted without looking at every hidden path for each.
        prefix = directory.rstrip("/") + "/"
        near = {h[len(prefix) :].partition("/")[0] for h in hide if h.startswith(prefix)}
        for name, entry in found:
            path = entry.path
            if name in near:
                if any(_inside(path, h) for h in hide):
                    continue  # hidden itself (or below a hidden path)
                if any(_inside(h, path) for h in hide):
                    walk(path)  # an ancestor of a hidden path: its other entries stay readable
                    continue
            try:  # the directory entry's type: no stat on most file systems
                if entry.is_symlink():
                    continue  # its target is covered (or not) by its own rule
                rights = READ if entry.is_dir(follow_symlinks=False) else READ & FILE_RIGHTS
            except OSError:
                continue
            rules.append((path, rights & handled))

    if any(_inside(h, root) for h in hide):
        walk(root)
    else:
        grant(root, READ)
    everything = fs_rights(abi)
    for path in writable:
        grant(path, everything)
    for path in appendable:
        grant(path, READ_FILE | WRITE_FILE)
    for device in DEVICES:
        grant(device, READ | WRITE_FILE | TRUNCATE | IOCTL_DEV | MAKE_REG | REMOVE_FILE)
    return rules


def restrict(
    rules: list[tuple[str, int]],
    *,
    abi: int,
    network: str = "allow",
    connect_ports: list[int] | tuple[int, ...] = (),
) -> None:
    """Set ``no_new_privs`` and bind this process (and all it starts) to ``rules``; with a
    ``network`` other than ``allow``, to no TCP bind and no TCP connect but to
    ``connect_ports``. Raises ``SandboxUnavailable`` when the kernel refuses."""
    if abi < MIN_ABI:
        raise SandboxUnavailable(errno.ENOSYS, unavailable("workspace", abi) or "no Landlock")
    import ctypes  # the shim imports it ahead of need (``shim._preload``)

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    def fail(what: str) -> SandboxUnavailable:
        code = ctypes.get_errno()
        return SandboxUnavailable(code, f"sandbox: {what}: {os.strerror(code)}")

    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise fail("prctl(PR_SET_NO_NEW_PRIVS)")

    class RulesetAttr(ctypes.Structure):
        _fields_ = [
            ("handled_access_fs", ctypes.c_uint64),
            ("handled_access_net", ctypes.c_uint64),
            ("scoped", ctypes.c_uint64),
        ]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    class NetPort(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]

    if (why := unavailable("workspace", abi, network)) is not None:
        raise SandboxUnavailable(errno.ENOSYS, why)
    attr = RulesetAttr(fs_rights(abi), net_rights(network, abi), scopes(abi))
    # An older kernel rejects a larger struct: ABI 1-3 know only the first field, 4-5 two.
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(
        ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
        ctypes.byref(attr),
        ctypes.c_size_t(size),
        ctypes.c_uint32(0),
    )
    if ruleset < 0:
        raise fail("landlock_create_ruleset")
    try:
        # One rule per entry of a directory that holds a hidden path (hundreds in /tmp):
        # the call's arguments are made once, the rule's fields set for each.
        syscall = libc.syscall
        add_rule = ctypes.c_long(SYS_LANDLOCK_ADD_RULE)
        ruleset_fd = ctypes.c_int(ruleset)
        path_beneath = ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH)
        no_flags = ctypes.c_uint32(0)
        rule = PathBeneath(0, -1)
        rule_ref = ctypes.byref(rule)
        flags = os.O_PATH | os.O_CLOEXEC
        for path, rights in rules:
            try:
                fd = os.open(path, flags)
            except OSError:
                continue  # gone since it was planned: nothing to grant
            try:
                rule.allowed_access = rights
                rule.parent_fd = fd
                if syscall(add_rule, ruleset_fd, path_beneath, rule_ref, no_flags) != 0:
                    raise fail(f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        for port in connect_ports if network == "allowlist" else ():
            net = NetPort(NET_CONNECT_TCP, port)
            if libc.syscall(
                ctypes.c_long(SYS_LANDLOCK_ADD_RULE),
                ctypes.c_int(ruleset),
                ctypes.c_int(LANDLOCK_RULE_NET_PORT),
                ctypes.byref(net),
                ctypes.c_uint32(0),
            ):
                raise fail(f"landlock_add_rule(TCP port {port})")
        if libc.syscall(
            ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)
        ):
            raise fail("landlock_restrict_self")
    finally:
        os.close(ruleset)


def enforce(sandbox: dict[str, object]) -> None:
    """Apply a run's sandbox (the spec's ``sandbox``: ``mode``, ``writable``, ``hidden``,
    ``appendable``, resolved absolute paths; ``network`` and its proxy's ``connect_ports``)
    to this process: the shim's child, just before ``exec``. An appendable file is created
    first: a rule needs an inode to name."""
    mode = str(sandbox.get("mode", "off"))
    network = str(sandbox.get("network", "allow"))
    if mode == "off":
        return
    abi = abi_version()
    ceiling = sandbox.get("abi")
    if isinstance(ceiling, int):  # the daemon's seam: a kernel that offers less
        abi = min(abi, ceiling)
    if (why := unavailable(mode, abi, network)) is not None:
        raise SandboxUnavailable(errno.ENOSYS, why)
    ports = [int(p) for p in sandbox.get("connect_ports", ())]  # type: ignore[attr-defined]
    writable = [str(p) for p in sandbox.get("writable", ())]  # type: ignore[attr-defined]
    hidden = [str(p) for p in sandbox.get("hidden", ())]  # type: ignore[attr-defined]
    appendable = [str(p) for p in sandbox.get("appendable", ())]  # type: ignore[attr-defined]
    for path in appendable:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except OSError:
            pass  # its directory is gone: nothing to write there anyway
    rules = plan(writable=writable, hidden=hidden, appendable=appendable, abi=abi)
    restrict(rules, abi=abi, network=network, connect_ports=ports)
