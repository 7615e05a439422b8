#!/usr/bin/env python3
"""A trivial agent: writes ``<task-id>.txt`` in its worktree, waits, exits 0.

    trivial.py [SECONDS]

The pause (default 0) lets a test observe several agents running at once.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    task = os.environ["GRID_TASK_ID"]
    Path(f"{task}.txt").write_text(f"work for {task}\n")
    print(f"trivial agent working on {task}", flush=True)
    time.sleep(seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
