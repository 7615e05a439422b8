"""What the kernel refuses a sandboxed agent, recorded: the shim's seccomp listener.

Standard library only, like the shim that loads it (``runs/shim.py``, ``python -I -S``).
A run whose ``network`` is ``none`` or ``allowlist`` is held by Landlock's TCP rules (no
``bind``, no ``connect`` but to its proxy's port: ``runs/landlock.py``) and by a seccomp
filter (no datagram, raw or packet socket: ``runs/seccomp.py``). Both refuse with
``EACCES`` and tell no one. So the shim's child installs that filter with a listener
(``seccomp.close_datagrams(listener)``), passes the listener's descriptor to the shim
(``SCM_RIGHTS`` over a socket pair made before the fork) and closes it before ``exec``: the
agent never holds it. A ``socket()`` the filter refuses, and every ``connect()`` or
``bind()`` whose address is as long as an internet one, then waits for the shim's answer
(``Supervisor``, a thread of the shim, which outlives the daemon):

- ``socket()``: refused with ``EACCES``, recorded (``socket``, ``udp``/``icmp``/``raw``/
  ``packet``/``type N``);
- ``connect()`` of an internet socket (the shim takes a copy of the agent's descriptor,
  ``pidfd_getfd``, and asks the socket itself, whose family cannot change): to the run's
  proxy, ``PROXY_HOST`` on a port Landlock allows (the same ``connect_ports`` given to
  Landlock: ``landlock_rules.connect_ports``), the shim connects the agent's own socket
  there itself, to the address it read, and answers with what that ``connect`` returned
  (``EINPROGRESS`` for a non-blocking socket, as the agent's own call would); to anywhere
  else, refused;
- ``connect()`` of any other socket (a Unix socket's path): let through
  (``SECCOMP_USER_NOTIF_FLAG_CONTINUE``): Landlock still decides, and no address can make
  a Unix socket reach the network;
- every ``bind()`` to an internet address, and any other ``connect()`` to one: refused
  with ``EACCES`` (what Landlock would answer: it allows no TCP bind and no other port)
  and recorded (``connect``/``bind``, ``203.0.113.5:443`` or ``[::1]:8080``).

Why this is safe: the listener never hands the kernel an internet connection to decide.
Landlock's TCP rules name a port and no address, so on their own they let an agent reach
any host on its proxy's port (a server of its own, listening there); the shim makes that
connection itself, to the proxy's address and to no other, from the bytes it read: an
agent that changes the address in its memory after the shim read it (the classic race of
a seccomp supervisor) changes nothing. What goes back to the kernel (a Unix socket's
``connect``, any ``bind``) meets Landlock's own check on the address the kernel reads
itself, and Landlock allows no TCP ``bind`` at all. The address is read from the agent's
memory (``/proc/<pid>/mem``), and the notification checked to be still pending afterwards
(``SECCOMP_IOCTL_NOTIF_ID_VALID``: the pid was not reused meanwhile). Where the shim may
not take the agent's descriptor (``pidfd_getfd`` needs the ptrace access that reading its
memory does: a Yama ``ptrace_scope`` of 2 or 3 refuses both), a ``connect()`` to an allowed
port goes back to Landlock, which decides by the port alone. If the
shim dies, its listener closes and every notified call fails with ``ENOSYS``: a refusal
still, though an allowed connection to the proxy fails as well (fail-closed; the run is an
orphan then anyway). A refused ``connect()`` or ``bind()`` may say ``EACCES`` where the
kernel would have said ``EINVAL`` (an address of another family than its socket's): never a
wider door.

The shim appends each refusal as a line of JSON to ``denied.ndjson`` in the run directory
(``{"kind", "target", "unreported", "at"}``), at most ``BURST`` lines in any ``WINDOW``
seconds: a loop of connections cannot fill the disk. The refusals held back are counted,
and said (``unreported``) with the next line written: when the window has room again, or
when the run ends. The daemon reads the file from its recorded offset (``runs/watch.py``, ``DeniedReader``) and
publishes ``agent.sandbox_denied`` through the same rate limit as the proxy's refusals
(``egress.DenialLimit``): exactly once across a daemon restart.

Not recorded: i386's ``socketcall`` (on x86_64), which the filter refuses outright (its
arguments are in memory, out of the filter's sight), and a connection or listener whose
address the shim cannot read (the process made itself undumpable): Landlock refuses it
unseen.

An agent cannot install a seccomp listener of its own (the kernel refuses a second one in
a process's filter chain, ``EBUSY``). The box executors (podman, Kubernetes: the in-box
shim, ``runs/boxshim.py``) take no sandboxed profile (``sandbox_unavailable``: the box is
the isolation), so none of this applies there; on macOS Seatbelt refuses and the system
log has it, not gridd.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time

if __package__:
    from gridd.runs import seccomp
else:  # loaded by the shim from its own directory (python -I -S): seccomp.py is beside it
    import seccomp  # type: ignore[no-redef]

#: The run file the shim appends refusals to.
DENIED_FILE = "denied.ndjson"
#: At most this many lines in any ``WINDOW`` seconds (fewer than the events' own limit,
#: ``egress.DenialLimit``'s 10 a minute, so the line that says the count held back here
#: has room there).
BURST = 8
WINDOW = 60.0

# <linux/seccomp.h>: struct seccomp_notif (id, pid, flags, then struct seccomp_data: nr,
# arch, instruction_pointer, args[6]) and struct seccomp_notif_resp (id, val, error, flags).
NOTIF = struct.Struct("=QIIiIQ6Q")
RESPONSE = struct.Struct("=QqiI")
# _IOWR('!', 0, struct seccomp_notif), _IOWR('!', 1, struct seccomp_notif_resp),
# _IOW('!', 2, __u64).
IOCTL_RECV = 0xC0000000 | NOTIF.size << 16 | 0x2100
IOCTL_SEND = 0xC0000000 | RESPONSE.size << 16 | 0x2101
IOCTL_ID_VALID = 0x40000000 | 8 << 16 | 0x2102
FLAG_CONTINUE = 1

AF_INET, AF_INET6, AF_PACKET = 2, 10, 17
SOCK_DGRAM, SOCK_RAW = 2, 3
IPPROTO_ICMP, IPPROTO_ICMPV6 = 1, 58
#: The longest address read: a ``sockaddr_in6``.
SOCKADDR_IN6 = 28
#: Where a run's proxy listens (``egress.LOOPBACK``), as an ``AF_INET`` socket and as an
#: ``AF_INET6`` one spells it: the only address an allowed port is reached at.
PROXY_HOST = "127.0.0.1"
PROXY_HOSTS = (PROXY_HOST, "::ffff:" + PROXY_HOST)
#: ``pidfd_getfd(2)``: the same number on every architecture (the unified table).
SYS_PIDFD_GETFD = 438


_libc: list[object] = []


def _syscall(*args: int) -> int:
    """libc's ``syscall`` (loaded once; ``ctypes``: the shim preloads it): -1 on failure."""
    if not _libc:
        import ctypes

        _libc.append(ctypes.CDLL(None, use_errno=True).syscall)
    return int(_libc[0](*args))  # type: ignore[operator]


def socket_target(family: int, kind: int, protocol: int) -> str:
    """What a refused ``socket()`` asked for, in a word."""
    if family == AF_PACKET:
        return "packet"
    kind &= seccomp.SOCK_TYPE_MASK
    if kind == SOCK_RAW:
        return "raw"
    if kind == SOCK_DGRAM:
        return "icmp" if protocol in (IPPROTO_ICMP, IPPROTO_ICMPV6) else "udp"
    return f"type {kind}"


def address(data: bytes, inet_ntop: object) -> tuple[str, int, int, str] | None:
    """``(host:port as written, port, family, host)`` of an internet ``sockaddr``; None for
    any other family, or one too short to be whole."""
    if len(data) < 2:
        return None
    family = int.from_bytes(data[:2], "little")
    if family == AF_INET and len(data) >= 8:
        port, host = int.from_bytes(data[2:4], "big"), ".".join(str(b) for b in data[4:8])
        return f"{host}:{port}", port, family, host
    if family == AF_INET6 and len(data) >= 24:
        port, host = int.from_bytes(data[2:4], "big"), inet_ntop(AF_INET6, data[8:24])  # type: ignore[operator]
        return f"[{host}]:{port}", port, family, str(host)
    return None


class Supervisor:
    """Answers the listener's notifications (``serve``, a thread of the shim) and appends
    the refusals to ``path``, rate-limited (``BURST`` in ``WINDOW``)."""

    def __init__(
        self, listener: int, path: str, ports: list[int], machine: str | None = None
    ) -> None:
        import _thread

        self.listener = listener
        self.path = path
        self.allowed = frozenset(ports)
        self.calls = seccomp.calls(machine)
        self.lock = _thread.allocate_lock()
        self.sent: list[float] = []
        self.held = 0
        self.last: tuple[str, str] | None = None
        self.fd: int | None = None

    # -- the thread ----------------------------------------------------------------------

    def serve(self) -> None:
        """Until the listener has no process left (or fails): answer each notification.
        Signals are blocked here, so the kernel gives the shim's to its main thread."""
        import _signal
        import _socket
        import select

        _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
        try:
            poller = select.poll()
            poller.register(self.listener, select.POLLIN)
            while True:
                for _fd, mask in poller.poll(self._due_ms()):
                    if mask & select.POLLIN:
                        self._one(_socket.inet_ntop)
                    elif mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                        return  # no process of the run is left to ask
                self.flush(final=False)
        except Exception as exc:  # a bug: never leave the agent's calls waiting for us
            os.write(2, f"gridd shim: seccomp listener failed: {exc!r}\n".encode())
        finally:
            # Closed, every call still waiting, and every later one, fails (ENOSYS).
            os.close(self.listener)

    def _due_ms(self) -> int | None:
        """How long until a held-back count can be written (None: nothing held)."""
        with self.lock:
            if not self.held or not self.sent:
                return None
            return max(0, int((self.sent[0] + WINDOW - time.monotonic()) * 1000) + 1)

    def _one(self, inet_ntop: object) -> None:
        buffer = bytearray(NOTIF.size)
        try:
            fcntl.ioctl(self.listener, IOCTL_RECV, buffer, True)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EINTR):
                return  # the caller went away before we took it, or a signal
            raise
        ident, pid, _flags, nr, arch, _ip, *args = NOTIF.unpack(buffer)
        call = self.calls.get((arch, nr))
        refused: tuple[str, str] | None = None
        if call == "socket":
            refused = ("socket", socket_target(args[0], args[1], args[2]))
        elif call in ("connect", "bind"):
            data = self._read(pid, args[1], min(args[2], SOCKADDR_IN6))
            theirs = self._socket(pid, args[0]) if call == "connect" else None
            pending = self._pending(ident)  # if not, the pid may be another process's now
            found = address(data, inet_ntop) if data is not None else None
            # An internet socket's connect is never the kernel's to make (Landlock would let
            # any host's proxy port through): to the proxy we connect it ourselves.
            inet = theirs is not None and theirs.family in (AF_INET, AF_INET6)
            allowed = found is not None and call == "connect" and found[1] in self.allowed
            if pending and inet and allowed and found is not None and found[3] in PROXY_HOSTS:
                self._connect_for(ident, theirs, found[2], found[3], found[1])
                return
            if theirs is not None:
                theirs.close()
            if not pending:
                return
            if inet:
                refused = ("connect", found[0] if found is not None else "unspecified")
            elif found is not None and not allowed:
                refused = (str(call), found[0])
        if refused is None:
            self._answer(ident, 0, FLAG_CONTINUE)  # Landlock decides
            return
        self._answer(ident, -errno.EACCES, 0)
        self.record(*refused)

    def _read(self, pid: int, at: int, size: int) -> bytes | None:
        try:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return os.pread(fd, size, at)
        except (OSError, OverflowError):
            return None
        finally:
            os.close(fd)

    def _socket(self, pid: int, fd: int):  # type: ignore[no-untyped-def]
        """A copy of the caller's descriptor ``fd`` (``pidfd_getfd``), as a socket; None if
        it cannot be taken (no ptrace access, an old kernel, gone) or is no socket."""
        import _socket

        try:
            with open(f"/proc/{pid}/status", "rb") as fh:  # the thread's process
                tgid = int(next(x for x in fh if x.startswith(b"Tgid:")).split()[1])
            pidfd = os.pidfd_open(tgid)
        except (OSError, StopIteration, ValueError):
            return None
        try:
            ours = _syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        finally:
            os.close(pidfd)
        if ours < 0:
            return None
        try:
            return _socket.socket(fileno=ours)
        except OSError:
            os.close(ours)
            return None

    def _connect_for(self, ident: int, theirs, family: int, host: str, port: int) -> None:  # type: ignore[no-untyped-def]
        """Connect the agent's socket to ``host:port`` (what we read, not what its memory
        says now) and answer with the outcome. A blocking socket's ``connect`` can wait
        (a proxy whose backlog is full): it is made in a thread of its own, so that the
        run's other calls are answered meanwhile."""
        if not os.get_blocking(theirs.fileno()):
            theirs.settimeout(0.0)  # as the agent's own call: EINPROGRESS, not a wait
            self._connected(ident, theirs, family, host, port)
            return
        import _thread

        _thread.start_new_thread(self._connected, (ident, theirs, family, host, port))

    def _connected(self, ident: int, theirs, family: int, host: str, port: int) -> None:  # type: ignore[no-untyped-def]
        try:
            where = (host, port) if family == AF_INET else (host, port, 0, 0)
            failed = theirs.connect_ex(where) if theirs.family == family else errno.EAFNOSUPPORT
        except (OSError, OverflowError, TypeError):
            failed = errno.EINVAL
        finally:
            theirs.close()  # our copy; the agent's descriptor is the one it had
        self._answer(ident, -failed, 0)

    def _pending(self, ident: int) -> bool:
        try:
            fcntl.ioctl(self.listener, IOCTL_ID_VALID, struct.pack("=Q", ident))
        except OSError:
            return False
        return True

    def _answer(self, ident: int, error: int, flags: int) -> None:
        try:
            fcntl.ioctl(self.listener, IOCTL_SEND, RESPONSE.pack(ident, 0, error, flags))
        except OSError:
            pass  # ENOENT: the caller was killed meanwhile

    # -- the record ----------------------------------------------------------------------

    def record(self, kind: str, target: str) -> None:
        """One refusal: a line now, or counted for the next one (``BURST`` in ``WINDOW``)."""
        with self.lock:
            now = time.monotonic()
            self.sent = [t for t in self.sent if now - t < WINDOW]
            if len(self.sent) >= BURST:
                self.held += 1
                self.last = (kind, target)
                return
            self.sent.append(now)
            self._write(kind, target, self.held)
            self.held, self.last = 0, None

    def flush(self, *, final: bool) -> None:
        """Write the last refusal held back, with the count of the others: when the window
        has room (``final``: the run ended, whatever the window)."""
        with self.lock:
            if not self.held or self.last is None:
                return
            now = time.monotonic()
            self.sent = [t for t in self.sent if now - t < WINDOW]
            if len(self.sent) >= BURST and not final:
                return
            self.sent.append(now)
            self._write(*self.last, self.held - 1)
            self.held, self.last = 0, None

    def _write(self, kind: str, target: str, unreported: int) -> None:
        # kind and target are of digits, letters, '.', ':', '[', ']' and ' ': JSON as is.
        line = (
            f'{{"kind": "{kind}", "target": "{target}", "unreported": {unreported},'
            f' "at": {time.time():.3f}}}\n'
        )
        try:
            if self.fd is None:
                self.fd = os.open(
                    self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
                )
            os.write(self.fd, line.encode())
        except OSError:
            pass  # a full disk: the refusal itself stands, its record is lost
