"""The listening Unix socket the baseline servers serve on, bound as gridd binds its own
(0600, non-blocking; a leftover file is replaced). Imports nothing but the standard
library's ``os`` and ``socket``, so it adds nothing to the memory those servers measure."""

from __future__ import annotations

import os
import socket


def listen_unix(path: str) -> socket.socket:
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(128)
    sock.setblocking(False)
    return sock
