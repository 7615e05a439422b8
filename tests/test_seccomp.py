"""The seccomp filter a run without the network gets (``runs/seccomp.py``): datagram, raw and
packet sockets and ``io_uring`` are refused, TCP, Unix and netlink sockets are not; with a
listener (the shim's, ``runs/refusals.py``), the refused sockets and the connections and
listeners to internet addresses wait for its answer, which it records.

Once on this kernel, in a forked child (a filter cannot be taken back), against the same
calls made without it; and, for the entry points this machine cannot run (i386 beside
x86_64, x32, aarch64 and arm), by running the filter's program in a small classic-BPF
interpreter over the ``seccomp_data`` the kernel would give it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gridd.runs import refusals, seccomp

DENIED = seccomp.RET_ERRNO | errno.EACCES
NOSYS = seccomp.RET_ERRNO | errno.ENOSYS
NOTIF = seccomp.RET_USER_NOTIF
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


ENTRY_POINTS = [
    ("x86_64", X86_64, 41, 42, 49),
    ("x86_64", I386, 359, 362, 361),
    ("aarch64", AARCH64, 198, 203, 200),
    ("aarch64", ARM, 281, 283, 282),
]


@pytest.mark.parametrize(("machine", "arch", "socket_nr", "connect_nr", "bind_nr"), ENTRY_POINTS)
def test_every_entry_point_is_held_to_the_same_socket_rules(
    machine: str, arch: int, socket_nr: int, connect_nr: int, bind_nr: int
) -> None:
    program = seccomp.program(machine)
    allow = seccomp.RET_ALLOW
    # Without a listener, connections and listeners are Landlock's alone.
    assert _run(program, arch, connect_nr, 3, 0, 16) == allow
    assert _run(program, arch, bind_nr, 3, 0, 28) == allow
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


@pytest.mark.parametrize(("machine", "arch", "socket_nr", "connect_nr", "bind_nr"), ENTRY_POINTS)
def test_with_a_listener_every_entry_point_asks_it_about_refusals_and_internet_addresses(
    machine: str, arch: int, socket_nr: int, connect_nr: int, bind_nr: int
) -> None:
    """The refused sockets, and every connect or bind whose address is as long as an
    internet one (16: ``sockaddr_in``; 28: ``sockaddr_in6``; 110: a Unix path, which the
    listener lets through), wait for the listener; shorter addresses, kept sockets and
    other calls do not."""
    program = seccomp.program(machine, notify=True)
    allow = seccomp.RET_ALLOW
    verdicts = {
        "udp": _run(program, arch, socket_nr, socket.AF_INET, socket.SOCK_DGRAM),
        "raw6": _run(program, arch, socket_nr, socket.AF_INET6, socket.SOCK_RAW),
        "packet": _run(program, arch, socket_nr, 17, socket.SOCK_DGRAM),
        "tcp": _run(program, arch, socket_nr, socket.AF_INET, socket.SOCK_STREAM),
        "unix": _run(program, arch, socket_nr, socket.AF_UNIX, socket.SOCK_DGRAM),
        "connect_in": _run(program, arch, connect_nr, 3, 0, 16),
        "connect_in6": _run(program, arch, connect_nr, 3, 0, 28),
        "connect_unix_path": _run(program, arch, connect_nr, 3, 0, 110),
        "connect_short": _run(program, arch, connect_nr, 3, 0, 15),
        "bind_in": _run(program, arch, bind_nr, 3, 0, 16),
        "bind_short": _run(program, arch, bind_nr, 3, 0, 2),
        "io_uring": _run(program, arch, seccomp.IO_URING_SETUP, 4, 0),
        "other_call": _run(program, arch, 0),
    }
    assert verdicts == {
        "udp": NOTIF,
        "raw6": NOTIF,
        "packet": NOTIF,
        "tcp": allow,
        "unix": allow,
        "connect_in": NOTIF,
        "connect_in6": NOTIF,
        "connect_unix_path": NOTIF,
        "connect_short": allow,
        "bind_in": NOTIF,
        "bind_short": allow,
        "io_uring": NOSYS,
        "other_call": allow,
    }
    assert seccomp.calls(machine)[(arch, connect_nr)] == "connect"
    assert seccomp.calls(machine)[(arch, bind_nr)] == "bind"
    assert seccomp.calls(machine)[(arch, socket_nr)] == "socket"


def _knock(allowed: int, refused: int, unix: str) -> dict[str, str]:
    """In the filtered child: what comes of each attempt (``ok`` or the errno's name)."""
    seen = {}
    attempts = {
        "allowed": lambda: socket.create_connection(("127.0.0.1", allowed), timeout=5).close(),
        "refused": lambda: socket.create_connection(("::1", refused), timeout=5).close(),
        "bind": lambda: socket.create_server(("127.0.0.1", 0)).close(),
        "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close(),
        "unix": lambda: socket.socket(socket.AF_UNIX).connect(unix),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            seen[name] = "ok"
        except OSError as exc:
            seen[name] = errno.errorcode[exc.errno or 0]
    return seen


def _with_listener(
    attempts: Callable[[], dict[str, str]], serve: Callable[[int], None]
) -> dict[str, str]:
    """A forked child installs the filter with a listener and sends it here; once
    ``serve(listener)`` returned, the child makes its ``attempts`` and says what came of
    them."""
    ours, theirs = socket.socketpair()
    read, write = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through the pipe)
        try:
            listener: list[int] = []
            why = seccomp.close_datagrams(listener)
            if why is None:
                socket.send_fds(theirs, [b"L"], listener)
                os.close(listener[0])
                os.read(go_read, 1)
            os.write(write, json.dumps(why or attempts()).encode())
        finally:
            os._exit(0)
    os.close(write)
    _msg, (fd,), _flags, _addr = socket.recv_fds(ours, 1, 1)
    serve(fd)
    os.write(go_write, b"x")
    with os.fdopen(read, "rb") as pipe:
        seen = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert isinstance(seen, dict), f"the filter was not installed: {seen}"
    return seen


@pytest.mark.skipif(not seccomp.supported(), reason="seccomp's filter covers x86_64 and aarch64")
def test_the_listener_lets_the_allowed_port_through_and_refuses_and_records_the_rest(
    tmp_path: Path,
) -> None:
    """On this kernel, without Landlock: a child installs the filter with a listener and
    sends it over; the ``Supervisor`` lets a connection to its allowed port (and a Unix
    path) go on, refuses the others with ``EACCES`` and writes a line for each."""
    server = socket.create_server(("127.0.0.1", 0))
    unix_path = str(tmp_path / "a-unix-socket-with-a-long-name")
    unix_server = socket.socket(socket.AF_UNIX)
    unix_server.bind(unix_path)
    unix_server.listen()
    allowed = int(server.getsockname()[1])
    path = tmp_path / refusals.DENIED_FILE
    threads: list[threading.Thread] = []

    def serve(listener: int) -> None:
        supervisor = refusals.Supervisor(listener, str(path), [allowed])
        threads.append(threading.Thread(target=supervisor.serve, daemon=True))
        threads[0].start()

    seen = _with_listener(lambda: _knock(allowed, 9, unix_path), serve)
    threads[0].join(10)
    server.close()
    unix_server.close()
    assert not threads[0].is_alive(), "the supervisor did not end with its last process"
    assert seen == {
        "allowed": "ok",
        "refused": "EACCES",
        "bind": "EACCES",
        "udp": "EACCES",
        "unix": "ok",
    }
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(d["kind"], d["target"], d["unreported"]) for d in lines] == [
        ("connect", "[::1]:9", 0),
        ("bind", "127.0.0.1:0", 0),
        ("socket", "udp", 0),
    ]


@pytest.mark.skipif(not seccomp.supported(), reason="seccomp's filter covers x86_64 and aarch64")
def test_without_its_listener_the_filter_fails_closed() -> None:
    """The shim gone (its listener closed), every call the filter would ask about fails
    with ``ENOSYS``: none goes through unasked. Other calls work on."""
    seen = _with_listener(lambda: _knock(9, 9, "/nonexistent"), os.close)
    assert seen == {
        "allowed": "ENOSYS",
        "refused": "ENOSYS",
        "bind": "ENOSYS",
        "udp": "ENOSYS",
        "unix": "ENOENT",  # too short an address to ask about: the kernel's own answer
    }, seen


def test_the_supervisor_writes_a_burst_then_one_line_with_the_count_held_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / refusals.DENIED_FILE
    supervisor = refusals.Supervisor(-1, str(path), [])
    for n in range(100):
        supervisor.record("connect", f"127.0.0.1:{n}")
    supervisor.flush(final=False)  # the window is full: nothing yet
    assert len(path.read_text().splitlines()) == refusals.BURST
    supervisor.flush(final=True)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == refusals.BURST + 1
    assert lines[-1]["target"] == "127.0.0.1:99"
    assert sum(1 + d["unreported"] for d in lines) == 100


def test_what_seccomp_cannot_read_or_does_not_know_is_refused() -> None:
    x86 = seccomp.program("x86_64")
    # i386's socketcall carries its arguments in memory: refused whatever they are.
    assert _run(x86, I386, 102, 1, 0) == DENIED
    assert _run(seccomp.program("x86_64", notify=True), I386, 102, 1, 0) == DENIED
    # x32's calls (the x32 bit on x86_64's numbers) and an unknown entry point: nothing.
    assert _run(x86, X86_64, seccomp.X32_SYSCALL_BIT | 41, socket.AF_INET, 1) == NOSYS
    assert _run(x86, 0xC0000000 | 0x1234, 41, socket.AF_INET, 1) == NOSYS
    assert _run(seccomp.program("aarch64"), X86_64, 41, socket.AF_INET, 1) == NOSYS
    assert not seccomp.supported("riscv64")
