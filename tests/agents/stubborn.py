#!/usr/bin/env python3
"""An agent that leaves partial work and then waits to be stopped.

    stubborn.py PID_DIR [ignore|exit]

It writes ``partial-<task-id>.txt`` in its worktree (never committing it), then its pid to
``PID_DIR/<task-id>.pid``. On SIGTERM it appends a line to ``PID_DIR/<task-id>.term`` and then
either exits 143 (``exit``, the default) or carries on (``ignore``: only SIGKILL ends it).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    pid_dir = Path(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "exit"
    task = os.environ["GRID_TASK_ID"]
    term_file = pid_dir / f"{task}.term"

    def on_term(signum: int, _frame: object) -> None:
        with term_file.open("a") as fh:
            fh.write(f"SIGTERM received by {os.getpid()}\n")
        if mode != "ignore":
            sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    Path(f"partial-{task}.txt").write_text(f"half-done work for {task}\n")
    tmp = pid_dir / f"{task}.pid.tmp"
    tmp.write_text(str(os.getpid()))
    tmp.replace(pid_dir / f"{task}.pid")
    print(f"working on {task}, will not finish by myself", flush=True)
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
