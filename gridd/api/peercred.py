"""Peer credentials: refuse any connection whose ``SO_PEERCRED`` uid is not the daemon's,
or whose process is a sandboxed run's.

The socket is already 0600 inside a 0700 directory; this is the second lock on the door
(root, or a loosened mode, would otherwise get through). The check runs in the HTTP
protocol's ``connection_made`` (``gridd.api.protocol``), before a byte of the request is read.

A sandboxed agent runs as the user, and Landlock does not stop ``connect()`` to a Unix
socket by its path (it hides the file's contents, not the way to it), so the daemon tells
its own agents apart (``sandboxed_peer``): a process that has ``no_new_privs`` (which a
sandboxed run sets, and which cannot be unset) and a shim among its ancestors. The shim is
its agent's child subreaper: nothing the agent starts, even double-forked and left behind,
gets out from under it while it lives, and from Landlock ABI 6 the agent cannot signal it.
An unsandboxed agent (no ``no_new_privs``) may call the API as before.
"""

from __future__ import annotations

import os
import socket
import struct

from gridd.api.errors import raw_error_response

_CRED = struct.Struct("3i")  # struct ucred { pid_t pid; uid_t uid; gid_t gid; }


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end, or None where the OS cannot tell."""
    cred = peer_cred(sock)
    return cred[1] if cred is not None else None


def peer_cred(sock: socket.socket) -> tuple[int, int] | None:
    """(pid, uid) of the process that connected, or None where the OS cannot tell. The pid
    is 0 when that process is in a pid namespace we cannot see into."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None or sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, opt, _CRED.size)
    pid, uid, _gid = _CRED.unpack(raw)
    return int(pid), int(uid)


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", "rb") as fh:
        lines = fh.read().decode(errors="replace").splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def sandboxed_peer(pid: int, shim: str) -> bool:
    """Whether process ``pid`` is inside a sandboxed run: it has ``no_new_privs``, and a
    process running ``shim`` (the shim's path, in its argv) is among its ancestors. A
    process already gone is taken for one (it may have handed its connection to a child
    before we looked); a pid we cannot see (0) or a system without ``/proc``, for none."""
    if pid <= 0 or not os.path.isdir("/proc/self"):
        return False
    try:
        status = _status(pid)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if status.get("NoNewPrivs") != "1":
        return False
    parent = int(status.get("PPid", "0") or 0)
    wanted = shim.encode()
    for _ in range(1024):  # a chain of ancestors is finite; this bounds a racing one
        if parent <= 1:
            return False
        try:
            with open(f"/proc/{parent}/cmdline", "rb") as fh:
                if wanted in fh.read().split(b"\0"):
                    return True
            parent = int(_status(parent).get("PPid", "0") or 0)
        except (OSError, ValueError):
            return False
    return False


def sandboxed_response(pid: int) -> bytes:
    """The whole HTTP answer to a sandboxed agent's connection."""
    return raw_error_response(
        403,
        "Forbidden",
        "sandboxed",
        f"process {pid} runs in a gridd sandbox, which may not use the daemon's API",
        {"peerPid": pid},
    )


def forbidden_response(uid: int) -> bytes:
    """The whole HTTP answer to a refused peer (nothing of its request is read)."""
    return raw_error_response(
        403,
        "Forbidden",
        "forbidden",
        f"uid {uid} may not use this gridd; it serves uid {os.getuid()} only",
        {"peerUid": uid},
    )
