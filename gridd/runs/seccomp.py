"""Seccomp: what Landlock's network rules leave open, closed for a run without the network;
and every refused connection made known to the shim.

Standard library only, like the shim that loads it (``runs/shim.py``, ``python -I -S``).
Landlock's network rights (ABI 4) are TCP's ``bind`` and ``connect``: a datagram socket is
not covered, so an agent whose profile says ``network = "none"`` or ``"allowlist"`` could
still send UDP anywhere (a DNS query to any server is a channel out, and a reply a channel
in), open a raw or ICMP socket, or make its sockets through ``io_uring``, which seccomp
does not see. Between ``fork`` and ``exec``, after Landlock, the shim's child installs a
seccomp filter (``close_datagrams``) that the agent and everything it starts inherit:

- ``socket()`` of ``AF_INET`` or ``AF_INET6`` of any type but ``SOCK_STREAM`` (UDP, raw,
  ICMP, SCTP) and of ``AF_PACKET`` is refused; Unix and netlink sockets are untouched
  (Landlock scopes the first, and ``getifaddrs`` needs the second);
- ``io_uring_setup`` fails with ``ENOSYS``, as on a kernel without it: programs fall back;
- the 32-bit entry points are held to the same: on x86_64, i386's ``socket`` is checked
  the same way and its ``socketcall`` (whose arguments seccomp cannot read) refused, and
  x32's calls fail; on aarch64, arm's ``socket``.

The shim installs it with a listener (``seccomp(2)``, ``SECCOMP_FILTER_FLAG_NEW_LISTENER``;
``program(notify=True)``): a refused ``socket()``, and every ``connect()`` and ``bind()``
whose address is as long as an internet one, waits for the shim's answer
(``SECCOMP_RET_USER_NOTIF``), which records the refusals (``runs/refusals.py``: the
``agent.sandbox_denied`` events of what the kernel refuses). The shim refuses the
``socket()`` with ``EACCES``, the error Landlock gives a refused TCP connection. Without
the listener (``close_datagrams()``, the tests) it is refused here with the same error.

Names still resolve from ``/etc/hosts`` (``localhost``), and a client that goes through the
run's proxy needs no DNS: the proxy resolves the hosts it allows. On a machine of another
architecture they cannot be closed, so a run that asks for it does not start
(``sandbox_unavailable``), never half-confined.
"""

from __future__ import annotations

import errno
import os
import struct

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
#: The call waits for the listener's answer (``runs/refusals.py``); with no listener left
#: (the shim died), it fails with ``ENOSYS``.
RET_USER_NOTIF = 0x7FC00000

# Classic BPF (<linux/bpf_common.h>): the instructions the filter needs.
LD_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ = 0x05 | 0x10  # BPF_JMP | BPF_JEQ | BPF_K
JGE = 0x05 | 0x30  # BPF_JMP | BPF_JGE | BPF_K
AND = 0x04 | 0x50  # BPF_ALU | BPF_AND | BPF_K
RET = 0x06  # BPF_RET | BPF_K

# struct seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (the low half first, on the
# little-endian machines below).
NR, ARCH, ARG0, ARG1, ARG2 = 0, 4, 16, 24, 32

AF_INET, AF_INET6, AF_PACKET = 2, 10, 17
SOCK_STREAM, SOCK_TYPE_MASK = 1, 0xF
#: The shortest address ``connect`` and ``bind`` take for AF_INET (``sockaddr_in``; AF_INET6
#: takes no less than 24): a shorter one is no internet address, and the kernel refuses it.
INET_ADDRLEN = 16
IO_URING_SETUP = 425  # the same on every architecture (the unified table)
X32_SYSCALL_BIT = 0x40000000


class Entry:
    """One entry point of a machine: its ``AUDIT_ARCH_*``, its socket calls' numbers, and
    the calls refused outright (i386's ``socketcall``, whose arguments are in memory). A
    plain class: ``dataclasses`` would cost the shim's start-up its imports."""

    __slots__ = ("arch", "bind", "connect", "refused", "socket")

    def __init__(
        self, arch: int, socket: int, connect: int, bind: int, refused: tuple[int, ...] = ()
    ) -> None:
        self.arch, self.socket, self.connect, self.bind = arch, socket, connect, bind
        self.refused = refused


ENTRIES: dict[str, list[Entry]] = {
    "x86_64": [Entry(0xC000003E, 41, 42, 49), Entry(0x40000003, 359, 362, 361, (102,))],
    "aarch64": [Entry(0xC00000B7, 198, 203, 200), Entry(0x40000028, 281, 283, 282)],
}
#: ``seccomp(2)``'s number, by machine.
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}

Instruction = tuple[int, int, int, int]


def supported(machine: str | None = None) -> bool:
    return (machine or os.uname().machine) in ENTRIES


def calls(machine: str | None = None) -> dict[tuple[int, int], str]:
    """``(arch, nr)`` -> ``socket``, ``connect`` or ``bind``, for every entry point of
    ``machine``: what a notification (``runs/refusals.py``) is about."""
    found: dict[tuple[int, int], str] = {}
    for entry in ENTRIES.get(machine or os.uname().machine, ()):
        for name in ("socket", "connect", "bind"):
            found[(entry.arch, getattr(entry, name))] = name
    return found


def _assemble(source: list[tuple[int, int | str, int | str, int] | str]) -> list[Instruction]:
    """Classic BPF from instructions whose jumps name labels (a ``str`` in the list marks
    where its label is); a jump is forward only, by at most 255."""
    where: dict[str, int] = {}
    count = 0
    for item in source:
        if isinstance(item, str):
            where[item] = count
        else:
            count += 1
    out: list[Instruction] = []
    for item in source:
        if isinstance(item, str):
            continue
        code, jt, jf, k = item
        here = len(out) + 1
        hops = [where[j] - here if isinstance(j, str) else j for j in (jt, jf)]
        if not all(0 <= h <= 255 for h in hops):
            raise ValueError(f"a jump the filter cannot make: {item}")
        out.append((code, hops[0], hops[1], k))
    return out


def program(machine: str, *, notify: bool = False) -> list[Instruction]:
    """The filter for ``machine`` (``os.uname().machine``), as ``(code, jt, jf, k)``.
    ``notify``: a refused ``socket`` and every ``connect`` or ``bind`` with an address as
    long as an internet one wait for the listener's answer (``RET_USER_NOTIF``) instead of
    failing (``socket``) or going on (the others) here."""
    denied = RET_USER_NOTIF if notify else RET_ERRNO | errno.EACCES
    nosys = RET_ERRNO | errno.ENOSYS
    source: list[tuple[int, int | str, int | str, int] | str] = [(LD_ABS, 0, 0, ARCH)]
    source += [(JEQ, f"entry{i}", 0, e.arch) for i, e in enumerate(ENTRIES[machine])]
    source.append((RET, 0, 0, nosys))  # another architecture's entry point: nothing runs
    for i, entry in enumerate(ENTRIES[machine]):
        source += [f"entry{i}", (LD_ABS, 0, 0, NR)]
        if entry.arch == 0xC000003E:
            source += [(JGE, "nosys", 0, X32_SYSCALL_BIT)]  # x32
        source += [(JEQ, "nosys", 0, IO_URING_SETUP)]
        source += [(JEQ, "refused", 0, nr) for nr in entry.refused]
        if notify:
            source += [(JEQ, "address", 0, entry.connect), (JEQ, "address", 0, entry.bind)]
        source += [(JEQ, "family", "allow", entry.socket)]
    source += [
        # socket(): AF_PACKET refused; AF_INET and AF_INET6 only of type SOCK_STREAM.
        "family",
        (LD_ABS, 0, 0, ARG0),
        (JEQ, "type", 0, AF_INET),
        (JEQ, "type", 0, AF_INET6),
        (JEQ, "denied", "allow", AF_PACKET),
        "type",
        (LD_ABS, 0, 0, ARG1),
        (AND, 0, 0, SOCK_TYPE_MASK),
        (JEQ, "allow", "denied", SOCK_STREAM),
    ]
    if notify:  # connect(), bind(): the listener reads an address long enough to be one
        source += ["address", (LD_ABS, 0, 0, ARG2), (JGE, "notify", "allow", INET_ADDRLEN)]
        source += ["notify", (RET, 0, 0, RET_USER_NOTIF)]
    source += ["refused", (RET, 0, 0, RET_ERRNO | errno.EACCES)]
    source += ["denied", (RET, 0, 0, denied), "allow", (RET, 0, 0, RET_ALLOW)]
    source += ["nosys", (RET, 0, 0, nosys)]
    return _assemble(source)


def close_datagrams(listener: list[int] | None = None) -> str | None:
    """Install the filter on this process (the shim's child, before ``exec``). With a
    ``listener`` list, the filter notifies (``program(notify=True)``) and its listener's
    descriptor (close-on-exec) is appended to it. What is missing when it cannot (the
    shim fails the start with it: ``sandbox_unavailable``), else None."""
    import ctypes  # the shim preloads it; not needed by a run that does not come here

    machine = os.uname().machine
    if not supported(machine):
        return (
            "closing UDP and raw sockets (network 'none' or 'allowlist') needs seccomp on"
            f" x86_64 or aarch64; this machine is {machine}"
        )
    code = b"".join(struct.pack("=HBBI", *i) for i in program(machine, notify=listener is not None))
    buffer = ctypes.create_string_buffer(code, len(code))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Program(len(code) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
    if libc.prctl(ctypes.c_int(PR_SET_NO_NEW_PRIVS), one, zero, zero, zero):
        return f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}"
    if listener is not None:
        libc.syscall.restype = ctypes.c_long
        fd = libc.syscall(
            ctypes.c_long(SYS_SECCOMP[machine]),
            ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
            ctypes.c_uint(SECCOMP_FILTER_FLAG_NEW_LISTENER),
            ctypes.byref(prog),
        )
        if fd < 0:
            why = os.strerror(ctypes.get_errno())
            return f"this kernel takes no seccomp filter with a listener (Linux 5.5): {why}"
        listener.append(int(fd))
        return None
    if libc.prctl(
        ctypes.c_int(PR_SET_SECCOMP),
        ctypes.c_ulong(SECCOMP_MODE_FILTER),
        ctypes.byref(prog),
        zero,
        zero,
    ):
        why = os.strerror(ctypes.get_errno())
        return f"this kernel takes no seccomp filter (CONFIG_SECCOMP_FILTER): {why}"
    return None
