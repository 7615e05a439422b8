"""Peer credentials: refuse any connection whose ``SO_PEERCRED`` uid is not the daemon's.

The socket is already 0600 inside a 0700 directory; this is the second lock on the door
(root, or a loosened mode, would otherwise get through). The check runs in the HTTP
protocol's ``connection_made`` (``gridd.api.protocol``), before a byte of the request is read.
"""

from __future__ import annotations

import os
import socket
import struct

from gridd.api.errors import raw_error_response

_CRED = struct.Struct("3i")  # struct ucred { pid_t pid; uid_t uid; gid_t gid; }


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end, or None where the OS cannot tell."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None or sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, opt, _CRED.size)
    _pid, uid, _gid = _CRED.unpack(raw)
    return int(uid)


def forbidden_response(uid: int) -> bytes:
    """The whole HTTP answer to a refused peer (nothing of its request is read)."""
    return raw_error_response(
        403,
        "Forbidden",
        "forbidden",
        f"uid {uid} may not use this gridd; it serves uid {os.getuid()} only",
        {"peerUid": uid},
    )
