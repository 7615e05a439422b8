#!/usr/bin/env python3
"""An agent that tries to get past its sandbox's network policy, then exits 0.

    network_attacks.py FORBIDDEN_PORT ALLOWED_PORT SETUID_PROGRAM

FORBIDDEN_PORT and ALLOWED_PORT are loopback HTTP listeners of the test (any request is
answered ``hello``); the profile's allow_hosts names only the allowed one. SETUID_PROGRAM is
a program whose set-user-ID bit would change our effective uid (it must keep running a
moment: it gets an argument ``5`` and a stdin that never ends).

It tries each attack itself, then has a grandchild (double-forked into a session of its own,
left behind) try them all again. What came of each is written into its worktree,
``network.json`` (its own) and ``network-grandchild.json``:

- ``direct``: a TCP connection straight to FORBIDDEN_PORT;
- ``proxy_forbidden``: ``CONNECT`` to it through ``HTTPS_PROXY`` (straight to it without one);
- ``proxy_allowed`` and ``http_allowed``: a request to ALLOWED_PORT through the proxy
  (``CONNECT``, and an absolute-form ``GET http://...``; straight without a proxy);
- ``bind``: a TCP listener of its own;
- ``setuid``: whether SETUID_PROGRAM ran with another effective uid than ours;
- ``daemon_socket``: ``GET /health`` on ``GRID_SOCKET``, the daemon's API;
- ``udp``: a datagram to FORBIDDEN_PORT over UDP (the listener echoes it back), which no
  proxy carries: a DNS query to any server would go the same way;
- ``raw``: an ICMP echo socket (``ping``'s), another way around the proxy.

Each is ``allowed`` (it worked) or ``denied``, with the reason after a colon for a denial.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit


def _why(exc: BaseException) -> str:
    return f"denied: {type(exc).__name__}: {exc}"


def _proxy() -> tuple[str, int] | None:
    url = os.environ.get("HTTPS_PROXY")
    if not url:
        return None
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _hello(sock: socket.socket) -> str:
    sock.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return "allowed" if b"hello" in data else f"denied: answer {data[:80]!r}"


def _connect_to(port: int) -> str:
    """Reach 127.0.0.1:port, through the proxy when there is one (``CONNECT``)."""
    proxy = _proxy()
    try:
        if proxy is None:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                return _hello(sock)
        with socket.create_connection(proxy, timeout=5) as sock:
            sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head and (chunk := sock.recv(1)):
                head += chunk
            status = head.split(b" ")[1] if head.count(b" ") else b"?"
            if status != b"200":
                return f"denied: proxy said {head.splitlines()[0]!r}" if head else "denied"
            return _hello(sock)
    except OSError as exc:
        return _why(exc)


def _direct(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            return _hello(sock)
    except OSError as exc:
        return _why(exc)


def _http(port: int) -> str:
    """A plain-HTTP request; urllib goes through HTTP_PROXY when it is set."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
            return "allowed" if b"hello" in answer.read() else "denied: no hello"
    except OSError as exc:
        return _why(exc)


def _bind() -> str:
    try:
        socket.create_server(("127.0.0.1", 0)).close()
    except OSError as exc:
        return _why(exc)
    return "allowed"


def _setuid(program: str) -> str:
    """Start it, and look at its effective uid (``/proc/<pid>/status``) while it runs."""
    try:
        proc = subprocess.Popen(
            [program, "5"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError as exc:
        return _why(exc)
    # The kernel closes the exec's close-on-exec files (Popen's sign that it ran) before
    # it gives the new program its credentials: look for a moment, not once.
    deadline = time.monotonic() + 0.5
    try:
        while True:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            uids = next(line for line in status.splitlines() if line.startswith("Uid:"))
            effective = int(uids.split()[2])
            if effective != os.geteuid():
                return "allowed"
            if time.monotonic() > deadline:
                return f"denied: euid stayed {effective}"
            time.sleep(0.01)
    except (OSError, StopIteration, ValueError) as exc:
        return _why(exc)
    finally:
        proc.kill()
        proc.wait()


def _daemon_socket() -> str:
    path = os.environ.get("GRID_SOCKET", "")
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(path)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: gridd\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
    except OSError as exc:
        return _why(exc)
    line = data.split(b"\r\n", 1)[0]
    return "allowed" if b" 200 " in line else f"denied: {line.decode(errors='replace')}"


def _udp(port: int) -> str:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(5)
            sock.sendto(b"hello", ("127.0.0.1", port))
            data, _ = sock.recvfrom(64)
    except OSError as exc:
        return _why(exc)
    return "allowed" if data == b"hello" else f"denied: answer {data!r}"


def _raw() -> str:
    """An ICMP socket: ``SOCK_RAW`` as root, else the unprivileged ``SOCK_DGRAM`` kind
    (which ``net.ipv4.ping_group_range`` may not grant: then neither way is open)."""
    kind = socket.SOCK_RAW if os.geteuid() == 0 else socket.SOCK_DGRAM
    try:
        socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP).close()
    except OSError as exc:
        return _why(exc)
    return "allowed"


def attacks(forbidden: int, allowed: int, program: str) -> dict[str, str]:
    return {
        "direct": _direct(forbidden),
        "proxy_forbidden": _connect_to(forbidden),
        "proxy_allowed": _connect_to(allowed),
        "http_allowed": _http(allowed),
        "bind": _bind(),
        "setuid": _setuid(program),
        "daemon_socket": _daemon_socket(),
        "udp": _udp(forbidden),
        "raw": _raw(),
    }


def main() -> int:
    forbidden, allowed, program = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    worktree = Path.cwd()
    (worktree / "network.json").write_text(json.dumps(attacks(forbidden, allowed, program)))
    done = worktree / "network-grandchild.json"
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # the grandchild, left behind
            done.with_suffix(".tmp").write_text(json.dumps(attacks(forbidden, allowed, program)))
            done.with_suffix(".tmp").rename(done)
        os._exit(0)
    os.wait()
    deadline = time.monotonic() + 30
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
