"""Peer credentials: only the daemon's own uid may talk to it, whatever the socket's mode."""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gridd.api.peercred import forbidden_response, peer_uid
from tests.support.api import raw_http
from tests.support.daemons import DaemonProc, inprocess_daemon

NOBODY = 65534
HEALTH = b"GET /health HTTP/1.1\r\nHost: gridd\r\nConnection: close\r\n\r\n"


def test_peer_uid_reports_the_other_end() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_uid(a) == os.getuid()


def test_forbidden_answer_is_complete_http_with_a_json_error() -> None:
    head, _, body = forbidden_response(NOBODY).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 403 Forbidden"
    assert f"content-length: {len(body)}" in lines
    assert "connection: close" in lines
    error = json.loads(body)["error"]
    assert error["code"] == "forbidden"
    assert error["details"] == {"peerUid": NOBODY}


async def test_daemon_refuses_a_uid_it_does_not_serve(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same composition as gridd, but told it serves another uid: our own uid is foreign."""
    import asyncio

    real_getuid = os.getuid
    monkeypatch.setattr(os, "getuid", lambda: real_getuid() + 1)
    async with inprocess_daemon(repo) as d:
        status, _headers, body = await asyncio.to_thread(raw_http, d.sock, HEALTH)
    assert status == 403
    assert json.loads(body)["error"]["details"]["peerUid"] == real_getuid()


@contextmanager
def _reachable_by_everyone(paths: list[Path]) -> Iterator[None]:
    """Loosen modes so that another uid can reach the socket at all; restore afterwards."""
    saved = [(p, stat.S_IMODE(p.lstat().st_mode)) for p in paths]
    try:
        for p in paths:
            os.chmod(p, 0o666 if stat.S_ISSOCK(p.lstat().st_mode) else 0o711)
        yield
    finally:
        for p, mode in saved:
            os.chmod(p, mode)


def _request_as(uid: int, sock: Path) -> bytes:
    """Fork, become ``uid``, send GET /health; what came back (or ERR:...)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: plain syscalls only, then _exit
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(10)
                s.connect(str(sock))
                try:
                    s.sendall(HEALTH)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            os.write(w, data[:60000])
        except BaseException as exc:
            os.write(w, f"ERR:{type(exc).__name__}:{exc}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    out = b""
    with os.fdopen(r, "rb") as pipe:
        out = pipe.read()
    os.waitpid(pid, 0)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another uid needs root")
def test_connection_from_another_uid_is_refused_even_through_an_open_socket(
    daemon: DaemonProc,
) -> None:
    assert os.stat(daemon.root.parent).st_mode & 0o001, "parent of the repo must be traversable"
    with _reachable_by_everyone([daemon.root, daemon.grid_dir, daemon.sock]):
        reply = _request_as(NOBODY, daemon.sock)
    assert not reply.startswith(b"ERR:"), reply
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403"), reply
    error = json.loads(body)["error"]
    assert error["code"] == "forbidden"
    assert error["details"]["peerUid"] == NOBODY
    # the owner is still served, and the refusal is on record
    assert daemon.client().get("/health")["status"] == "ok"
    assert f"refused connection from uid {NOBODY}" in daemon.stderr_text()
    assert stat.S_IMODE(daemon.sock.lstat().st_mode) == 0o600
