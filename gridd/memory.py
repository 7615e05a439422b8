"""Process memory: what a burst of agent output borrowed is given back to the system.

A flood of output passes through the daemon as 64 KiB pieces (a chunk's text, its JSON, its
SSE encoding). glibc's malloc serves blocks that size from the heap once its dynamic mmap
threshold has risen (it rises to the largest block freed, up to 32 MiB), and a heap gives
memory back by itself only from its top: after a 20 MiB flood the daemon kept ~40 MB it no
longer used. ``trim()`` (``malloc_trim``) hands the heap's free pages back, wherever they
are. Pinning the mmap threshold instead (``mallopt``) was measured too: it returned the
memory as well, but every 64 KiB block then cost a fresh mapping and its page faults, and
output delivery was ~50 % slower.

glibc only; elsewhere (musl, macOS), or if anything fails, ``trim`` does nothing.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, loaded on first use (never at import: a daemon at rest does not need it)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here, not at the top: ctypes is loaded only by a daemon that trims

    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's soname: no ldconfig run to find it
        libc.malloc_trim  # noqa: B018  (glibc has it; musl does not)
    except (OSError, AttributeError):
        return None
    return libc


def trim() -> bool:
    """Give the heap's free pages back to the system; True when any were."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))
