"""gridd: a per-workspace daemon that runs several AI coding agents on one repository.

The public surface is deliberately small: the version numbers, the exception tree and the
client. Everything else is reached through the daemon's HTTP API over its Unix socket.
"""

from __future__ import annotations

__version__ = "0.1.0"
#: Bumped when the wire API changes incompatibly; clients compare it on connect.
API_VERSION = 1
#: The agent-supervisor (shim) format: run directories, spec, exit records. A new daemon
#: takes over running agents (``gridctl daemon upgrade``) from any daemon whose number is
#: in ``HANDOVER_ADOPTS``; bump both when a change makes older shims unreadable.
HANDOVER_PROTOCOL = 1
HANDOVER_ADOPTS = frozenset({1})

__all__ = ["API_VERSION", "HANDOVER_ADOPTS", "HANDOVER_PROTOCOL", "__version__"]
