"""gridd: a per-workspace daemon that runs several AI coding agents on one repository.

The public surface is deliberately small: the version numbers, the exception tree and the
client. Everything else is reached through the daemon's HTTP API over its Unix socket.
"""

from __future__ import annotations

__version__ = "0.1.0"
#: Bumped when the wire API changes incompatibly; clients compare it on connect.
API_VERSION = 1

__all__ = ["API_VERSION", "__version__"]
