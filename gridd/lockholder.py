"""Who holds an ``flock``: the kernel's answer (``/proc/locks``, Linux), not a pid file's.

The daemon names the holder when it refuses to start (``AlreadyRunning``) and ``gridctl
doctor`` names it for a lock held with no daemon answering. The pid gridd writes into
``gridd.lock`` is only a claim: a daemon of another version may write none, and any
program can ``flock`` the file. It imports nothing of gridd's, so both sides may use it.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_LOCKS = Path("/proc/locks")


def flock_holder(path: Path, *, proc_locks: Path | None = None) -> int | None:
    """The pid the kernel shows holding an ``flock`` on ``path``, or None when no one does;
    0 when it is held by a process outside this pid namespace (the kernel shows no pid).

    Raises ``OSError`` when it cannot tell: ``path`` is gone or ``/proc/locks`` cannot be
    read (not Linux). Waiters (``->`` lines) and ``fcntl`` locks are not holders. The pid
    is the process that took the lock: it may have ended since, leaving the lock to a child
    that inherited the descriptor.
    """
    st = path.stat()
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in (proc_locks or PROC_LOCKS).read_text().splitlines():
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == device:
            try:
                pid = int(fields[4])
            except ValueError:
                continue
            if pid >= 0:
                return pid
    return None


def describe(pid: int) -> str:
    """``pid``'s command line (at most 120 characters), "?" when it has none, "gone" when
    the process has ended. psutil is imported here, on the rare path that needs it."""
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())[:120] or "?"
    except psutil.Error:
        return "gone"
