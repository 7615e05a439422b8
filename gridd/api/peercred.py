"""Peer credentials: refuse any connection whose ``SO_PEERCRED`` uid is not the daemon's.

The socket is already 0600 inside a 0700 directory; this is the second lock on the door
(root, or a loosened mode, would otherwise get through). The check runs in the HTTP
protocol's ``connection_made``, before a single byte of the request is read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import struct
from typing import Any

log = logging.getLogger(__name__)

_CRED = struct.Struct("3i")  # struct ucred { pid_t pid; uid_t uid; gid_t gid; }


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end, or None where the OS cannot tell."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None or sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, opt, _CRED.size)
    _pid, uid, _gid = _CRED.unpack(raw)
    return uid


def _forbidden_response(uid: int) -> bytes:
    body = json.dumps(
        {
            "error": {
                "code": "forbidden",
                "message": f"uid {uid} may not use this gridd; it serves uid {os.getuid()} only",
                "details": {"peerUid": uid},
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    return head + body


def peer_checked(base: type[asyncio.Protocol], allowed_uid: int) -> type[asyncio.Protocol]:
    """Subclass uvicorn's HTTP protocol class so that foreign peers are turned away."""

    class PeerCheckedProtocol(base):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: Any) -> None:
            sock = transport.get_extra_info("socket")
            uid = peer_uid(sock) if sock is not None else None
            if uid is not None and uid != allowed_uid:
                log.warning("refused connection from uid %d", uid)
                transport.write(_forbidden_response(uid))
                transport.close()
                return
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            if getattr(self, "transport", None) is None:
                return  # refused in connection_made
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if getattr(self, "transport", None) is None:
                return
            super().connection_lost(exc)

    PeerCheckedProtocol.__name__ = f"PeerChecked{base.__name__}"
    return PeerCheckedProtocol
