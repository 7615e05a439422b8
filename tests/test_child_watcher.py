"""The daemon waits for its git children with a pidfd on the event loop, not with a thread
per child (Python 3.11's default): one fewer thread start and ``waitpid`` per git call."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import asyncio, threading
from gridd.daemon import use_pidfd_child_watcher
used = use_pidfd_child_watcher()

async def main():
    procs = [await asyncio.create_subprocess_exec("sleep", "0.3") for _ in range(5)]
    threads = threading.active_count()
    codes = [await p.wait() for p in procs]
    return threads, codes

threads, codes = asyncio.run(main())
print(used, threads, codes)
"""


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 waits with a pidfd by itself")
def test_the_daemon_waits_for_five_children_without_a_thread_each() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=30
    ).stdout.split(maxsplit=2)
    assert out[0] == "True", "pidfd_open is available on this kernel"
    assert out[1] == "1"  # only the main thread, while five children run
    assert out[2].strip() == "[0, 0, 0, 0, 0]"  # and every exit status still arrives
