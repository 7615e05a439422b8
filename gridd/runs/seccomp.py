"""Seccomp: what Landlock's network rules leave open, closed for a run without the network.

Standard library only, like the shim that loads it (``runs/shim.py``, ``python -I -S``).
Landlock's network rights (ABI 4) are TCP's ``bind`` and ``connect``: a datagram socket is
not covered, so an agent whose profile says ``network = "none"`` or ``"allowlist"`` could
still send UDP anywhere (a DNS query to any server is a channel out, and a reply a channel
in), open a raw or ICMP socket, or make its sockets through ``io_uring``, which seccomp
does not see. Between ``fork`` and ``exec``, after Landlock, the shim's child installs a
seccomp filter (``close_datagrams``) that the agent and everything it starts inherit:

- ``socket()`` of ``AF_INET`` or ``AF_INET6`` of any type but ``SOCK_STREAM`` (UDP, raw,
  ICMP, SCTP) and of ``AF_PACKET`` fails with ``EACCES``, the error Landlock gives a
  refused TCP connection; Unix and netlink sockets are untouched (Landlock scopes the
  first, and ``getifaddrs`` needs the second);
- ``io_uring_setup`` fails with ``ENOSYS``, as on a kernel without it: programs fall back;
- the 32-bit entry points are held to the same: on x86_64, i386's ``socket`` is checked
  the same way and its ``socketcall`` (whose arguments seccomp cannot read) refused, and
  x32's calls fail; on aarch64, arm's ``socket``.

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
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

# Classic BPF (<linux/bpf_common.h>): the instructions the filter needs.
LD_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ = 0x05 | 0x10  # BPF_JMP | BPF_JEQ | BPF_K
JGE = 0x05 | 0x30  # BPF_JMP | BPF_JGE | BPF_K
AND = 0x04 | 0x50  # BPF_ALU | BPF_AND | BPF_K
RET = 0x06  # BPF_RET | BPF_K

# struct seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (the low half first, on the
# little-endian machines below).
NR, ARCH, ARG0, ARG1 = 0, 4, 16, 24

AF_INET, AF_INET6, AF_PACKET = 2, 10, 17
SOCK_STREAM, SOCK_TYPE_MASK = 1, 0xF
IO_URING_SETUP = 425  # the same on every architecture (the unified table)
X32_SYSCALL_BIT = 0x40000000

# (AUDIT_ARCH_*, socket's number, numbers refused outright) per entry point, by machine.
ENTRIES: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {
    "x86_64": [(0xC000003E, 41, ()), (0x40000003, 359, (102,))],  # x86_64; i386 (socketcall)
    "aarch64": [(0xC00000B7, 198, ()), (0x40000028, 281, ())],  # aarch64; arm
}

Instruction = tuple[int, int, int, int]


def supported(machine: str | None = None) -> bool:
    return (machine or os.uname().machine) in ENTRIES


def program(machine: str) -> list[Instruction]:
    """The filter for ``machine`` (``os.uname().machine``), as ``(code, jt, jf, k)``."""
    entries = ENTRIES[machine]
    denied, allow, nosys = RET_ERRNO | errno.EACCES, RET_ALLOW, RET_ERRNO | errno.ENOSYS
    # Assembled back to front, so that every jump's distance is known when it is written.
    tail: list[Instruction] = [
        # check_type: args[1] & SOCK_TYPE_MASK must be SOCK_STREAM.
        (LD_ABS, 0, 0, ARG1),
        (AND, 0, 0, SOCK_TYPE_MASK),
        (JEQ, 1, 0, SOCK_STREAM),
        (RET, 0, 0, denied),
        (RET, 0, 0, allow),
    ]
    check_family: list[Instruction] = [
        (LD_ABS, 0, 0, ARG0),
        (JEQ, 4, 0, AF_INET),  # -> check_type
        (JEQ, 3, 0, AF_INET6),  # -> check_type
        (JEQ, 1, 0, AF_PACKET),  # -> denied
        (RET, 0, 0, allow),
        (RET, 0, 0, denied),
    ]
    after: list[Instruction] = check_family + tail  # what every entry's socket() jumps to
    blocks: list[list[Instruction]] = []
    for arch, socket_nr, refused in reversed(entries):
        # Distance from the instruction after this block's jump to check_family.
        ahead = sum(len(b) for b in blocks)
        block: list[Instruction] = [(LD_ABS, 0, 0, NR)]
        if arch == 0xC000003E:
            block.append((JGE, 0, 1, X32_SYSCALL_BIT))
            block.append((RET, 0, 0, nosys))
        block.append((JEQ, 0, 1, IO_URING_SETUP))
        block.append((RET, 0, 0, nosys))
        for nr in refused:
            block.append((JEQ, 0, 1, nr))
            block.append((RET, 0, 0, denied))
        block.append((JEQ, 1 + ahead, 0, socket_nr))  # over the RET below and later blocks
        block.append((RET, 0, 0, allow))
        if ahead + 1 > 255:
            raise ValueError("filter too long for a jump")
        blocks.insert(0, block)
    head: list[Instruction] = [(LD_ABS, 0, 0, ARCH)]
    offsets = []
    position = 0
    for block in blocks:
        offsets.append(position)
        position += len(block)
    dispatch_len = len(entries) + 1  # a JEQ per arch and the unknown-arch RET
    for i, (arch, _, _) in enumerate(entries):
        # From after this JEQ to the start of block i.
        head.append((JEQ, dispatch_len - 1 - i + offsets[i], 0, arch))
    head.append((RET, 0, 0, nosys))  # another architecture's entry point: nothing runs
    return head + [i for block in blocks for i in block] + after


def close_datagrams() -> str | None:
    """Install the filter on this process (the shim's child, before ``exec``). What is
    missing when it cannot (the shim fails the start with it: ``sandbox_unavailable``),
    else None."""
    import ctypes  # the shim preloads it; not needed by a run that does not come here

    machine = os.uname().machine
    if not supported(machine):
        return (
            "closing UDP and raw sockets (network 'none' or 'allowlist') needs seccomp on"
            f" x86_64 or aarch64; this machine is {machine}"
        )
    code = b"".join(struct.pack("=HBBI", *i) for i in program(machine))
    buffer = ctypes.create_string_buffer(code, len(code))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Program(len(code) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
    if libc.prctl(ctypes.c_int(PR_SET_NO_NEW_PRIVS), one, zero, zero, zero):
        return f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}"
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
