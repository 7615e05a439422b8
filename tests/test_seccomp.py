"""The seccomp filter a run without the network gets (``runs/seccomp.py``): datagram, raw and
packet sockets and ``io_uring`` are refused, TCP, Unix and netlink sockets are not.

Once on this kernel, in a forked child (a filter cannot be taken back), against the same
calls made without it; and, for the entry points this machine cannot run (i386 beside
x86_64, x32, aarch64 and arm), by running the filter's program in a small classic-BPF
interpreter over the ``seccomp_data`` the kernel would give it.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

import pytest

from gridd.runs import seccomp

DENIED = seccomp.RET_ERRNO | errno.EACCES
NOSYS = seccomp.RET_ERRNO | errno.ENOSYS
I386, X86_64, AARCH64, ARM = 0x40000003, 0xC000003E, 0xC00000B7, 0x40000028


def _attempts() -> dict[str, str]:
    """What comes of each call here: ``ok`` or the errno's name."""
    import ctypes

    calls = {
        "udp": (socket.AF_INET, socket.SOCK_DGRAM, 0),
        "udp6_nonblocking": (socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK, 0),
        "icmp_raw": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "packet": (socket.AF_PACKET, socket.SOCK_RAW, 0),
        "tcp": (socket.AF_INET, socket.SOCK_STREAM, 0),
        "tcp6_cloexec": (socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_CLOEXEC, 0),
        "unix_datagram": (socket.AF_UNIX, socket.SOCK_DGRAM, 0),
        "netlink": (socket.AF_NETLINK, socket.SOCK_RAW, 0),
    }
    seen = {}
    for name, args in calls.items():
        try:
            socket.socket(*args).close()
            seen[name] = "ok"
        except OSError as exc:
            seen[name] = errno.errorcode[exc.errno or 0]
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)
    fd = libc.syscall(ctypes.c_long(seccomp.IO_URING_SETUP), ctypes.c_uint(4), params)
    if fd >= 0:
        os.close(fd)
        seen["io_uring"] = "ok"
    else:
        seen["io_uring"] = errno.errorcode[ctypes.get_errno()]
    return seen


def _in_child(install: bool) -> dict[str, str]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through the pipe)
        try:
            why = seccomp.close_datagrams() if install else None
            os.write(write, repr(why or _attempts()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(pid, 0)
    import ast

    result = ast.literal_eval(text)
    assert isinstance(result, dict), f"the filter was not installed: {result}"
    return result


@pytest.mark.skipif(not seccomp.supported(), reason="seccomp's filter covers x86_64 and aarch64")
def test_the_filter_refuses_datagram_raw_packet_sockets_and_io_uring_and_keeps_the_rest() -> None:
    without, within = _in_child(install=False), _in_child(install=True)
    refused = {"udp", "udp6_nonblocking", "icmp_raw", "packet"}
    assert all(without[name] == "ok" for name in refused), without  # they work here
    assert {name: within[name] for name in refused} == dict.fromkeys(refused, "EACCES")
    assert within["io_uring"] == "ENOSYS", within
    kept = {"tcp", "tcp6_cloexec", "unix_datagram", "netlink"}
    assert {name: within[name] for name in kept} == dict.fromkeys(kept, "ok"), within


def _run(program: list[seccomp.Instruction], arch: int, nr: int, *args: int) -> int:
    """Classic BPF, as much of it as the filter uses, over a ``struct seccomp_data``."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        pc += 1
        if code == seccomp.LD_ABS:
            (acc,) = struct.unpack_from("<I", data, k)
        elif code == seccomp.AND:
            acc &= k
        elif code == seccomp.JEQ:
            pc += jt if acc == k else jf
        elif code == seccomp.JGE:
            pc += jt if acc >= k else jf
        elif code == seccomp.RET:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


@pytest.mark.parametrize(
    ("machine", "arch", "socket_nr"),
    [
        ("x86_64", X86_64, 41),
        ("x86_64", I386, 359),
        ("aarch64", AARCH64, 198),
        ("aarch64", ARM, 281),
    ],
)
def test_every_entry_point_is_held_to_the_same_socket_rules(
    machine: str, arch: int, socket_nr: int
) -> None:
    program = seccomp.program(machine)
    allow = seccomp.RET_ALLOW
    verdicts = {
        "udp": _run(program, arch, socket_nr, socket.AF_INET, socket.SOCK_DGRAM),
        "udp6": _run(program, arch, socket_nr, socket.AF_INET6, socket.SOCK_DGRAM | 0o4000),
        "raw": _run(program, arch, socket_nr, socket.AF_INET, socket.SOCK_RAW),
        "packet": _run(program, arch, socket_nr, 17, socket.SOCK_DGRAM),
        "tcp": _run(program, arch, socket_nr, socket.AF_INET6, socket.SOCK_STREAM | 0o2000000),
        "unix": _run(program, arch, socket_nr, socket.AF_UNIX, socket.SOCK_DGRAM),
        "io_uring": _run(program, arch, seccomp.IO_URING_SETUP, 4, 0),
        "other_call": _run(program, arch, 0),
    }
    assert verdicts == {
        "udp": DENIED,
        "udp6": DENIED,
        "raw": DENIED,
        "packet": DENIED,
        "tcp": allow,
        "unix": allow,
        "io_uring": NOSYS,
        "other_call": allow,
    }


def test_what_seccomp_cannot_read_or_does_not_know_is_refused() -> None:
    x86 = seccomp.program("x86_64")
    # i386's socketcall carries its arguments in memory: refused whatever they are.
    assert _run(x86, I386, 102, 1, 0) == DENIED
    # x32's calls (the x32 bit on x86_64's numbers) and an unknown entry point: nothing.
    assert _run(x86, X86_64, seccomp.X32_SYSCALL_BIT | 41, socket.AF_INET, 1) == NOSYS
    assert _run(x86, 0xC0000000 | 0x1234, 41, socket.AF_INET, 1) == NOSYS
    assert _run(seccomp.program("aarch64"), X86_64, 41, socket.AF_INET, 1) == NOSYS
    assert not seccomp.supported("riscv64")
