"""Landlock: what this kernel's file-system sandbox offers, and its system calls.

Standard library only, like the shim that loads it (``runs/shim.py`` runs as
``python -I -S``, with nothing of gridd's or of site-packages on its path). The daemon asks
it what the kernel can enforce (``abi_version``, ``unavailable``); the shim's child builds
and applies a run's ruleset with it (``runs/landlock_rules.py``). A ruleset binds the agent
and everything it ever starts: children, grandchildren, daemons it leaves behind.
``no_new_privs`` is set first (Landlock needs it without ``CAP_SYS_ADMIN``, and a setuid
binary then gains nothing).

Landlock is an allow-list: every file-system right this kernel knows (its ABI) is denied
except beneath the paths a rule names; which rights exist depends on the ABI
(``fs_rights``). The network (ABI 4): a run whose ``network`` is ``none`` or ``allowlist``
may neither bind a TCP port nor connect to one, except (``allowlist``) to the port of its
own filtering proxy (``runs/egress.py``), which the daemon runs on loopback. Landlock's TCP
rules name a port, not an address, and cover TCP only (UDP and Unix sockets are not network
rights). Scopes (ABI 6) keep signals and abstract Unix sockets inside the sandbox.
"""

from __future__ import annotations

import os
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


class Kernel:
    """Landlock's three system calls and ``prctl``, through ``ctypes``, with their constant
    arguments made once per process. The shim server (and a spare shim) makes it before it
    forks a run's shim (``prepare``), so a run's child neither loads the C library nor
    defines a structure: per rule it sets two fields and makes one call (hundreds of rules
    when the workspace sits in a directory such as ``/tmp``)."""

    def __init__(self) -> None:
        import ctypes

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

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        self.ctypes = ctypes
        self.libc = libc
        self.syscall = libc.syscall
        self.attr_type = RulesetAttr
        self.port_type = NetPort
        self.create_nr = ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET)
        self.add_nr = ctypes.c_long(SYS_LANDLOCK_ADD_RULE)
        self.restrict_nr = ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF)
        self.path_beneath = ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH)
        self.net_port = ctypes.c_int(LANDLOCK_RULE_NET_PORT)
        self.no_flags = ctypes.c_uint32(0)
        self.rule = PathBeneath(0, -1)
        self.rule_ref = ctypes.byref(self.rule)
        version = self.syscall(
            self.create_nr,
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
        )
        self.abi = max(int(version), 0)

    def failure(self, what: str) -> SandboxUnavailable:
        code = self.ctypes.get_errno()
        return SandboxUnavailable(code, f"sandbox: {what}: {os.strerror(code)}")


_kernels: list[Kernel] = []  # made once per process (``kernel``)


def kernel() -> Kernel:
    """This process's ``Kernel`` (made at the first call)."""
    if not _kernels:
        _kernels.append(Kernel())
    return _kernels[0]


def prepare() -> None:
    """Make what ``enforce`` calls the kernel with (the C library, the structures, the ABI)
    ahead of need: the shim server and a spare shim do, before they fork a run's shim."""
    if sys.platform.startswith("linux"):
        try:
            kernel()
        except (OSError, ImportError, AttributeError):
            pass  # enforce says why, if a run asks for a sandbox


def abi_version() -> int:
    """The Landlock ABI this kernel offers (0: none: not Linux, too old, or disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        return kernel().abi
    except (OSError, ImportError, AttributeError):
        return 0


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
