"""The socket under a crowd: headers must arrive within ``daemon.header_timeout_seconds``
(408 otherwise), and past ``daemon.max_connections`` open connections only /health,
/version and /shutdown answer (503 for the rest), so a swamped daemon can always be
checked and stopped. Real daemon, real sockets."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.support.api import api_call, raw_http
from tests.support.daemons import running_daemon
from tests.support.repos import write_config
from tests.support.waits import wait_for


def _idle(sock: Path, n: int) -> list[socket.socket]:
    conns = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(sock))
        conns.append(s)
    return conns


def test_slow_headers_get_408_and_the_connection_is_closed(repo: Path) -> None:
    write_config(repo, "[daemon]\nheader_timeout_seconds = 1.0\n")
    with running_daemon(repo) as d:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(15)
            s.connect(str(d.sock))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: gr")  # and never the rest
            began = time.monotonic()
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
            waited = time.monotonic() - began
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"header_timeout" in reply
        assert waited < 10
        assert d.client().get("/health")["status"] == "ok"


def test_a_later_request_on_a_kept_alive_connection_gets_its_own_header_wait(
    repo: Path,
) -> None:
    # The wait runs from the start of each request, not of the connection: a client that
    # pauses between requests is not cut off early, and a stalled later request still is.
    write_config(repo, "[daemon]\nheader_timeout_seconds = 1.0\n")
    with running_daemon(repo) as d:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(15)
            s.connect(str(d.sock))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: gridd\r\n\r\n")
            first = b""
            while b"}" not in first:
                first += s.recv(65536)
            assert first.startswith(b"HTTP/1.1 200")
            time.sleep(0.6)  # part of the first wait gone, idle between requests
            s.sendall(b"GET /health HTTP/1.1\r\nHost: gr")  # and never the rest
            began = time.monotonic()
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
            waited = time.monotonic() - began
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert 0.9 <= waited < 10


def test_past_the_connection_cap_only_reserved_paths_answer(repo: Path) -> None:
    write_config(repo, "[daemon]\nmax_connections = 8\nheader_timeout_seconds = 30\n")
    with running_daemon(repo) as d:
        crowd = _idle(d.sock, 8)
        try:
            time.sleep(0.3)  # let the daemon accept them all
            status, _, body = raw_http(
                d.sock, b"GET /state HTTP/1.1\r\nHost: gridd\r\nConnection: close\r\n\r\n"
            )
            assert status == 503, body
            assert b"too_many_connections" in body
            status, _, body = raw_http(
                d.sock, b"GET /health HTTP/1.1\r\nHost: gridd\r\nConnection: close\r\n\r\n"
            )
            assert status == 200, body
            more = _idle(d.sock, 20)  # past the reserved slots too: answered 503 at once
            try:
                more[-1].settimeout(5)
                assert more[-1].recv(100).startswith(b"HTTP/1.1 503")
            finally:
                for s in more:
                    s.close()
        finally:
            for s in crowd:
                s.close()
        # The crowd gone, the daemon serves everything again.
        wait_for(lambda: api_call(d.sock, "GET", "/state")[0] == 200, timeout=10)
        assert d.client().get("/state")["daemon"]["pid"] == d.proc.pid
