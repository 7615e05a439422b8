#!/usr/bin/env python3
"""An agent that leaves COUNT new files in its worktree (slow to commit), then exits 0.

manyfiles.py COUNT
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> int:
    count = int(sys.argv[1])
    task = os.environ["GRID_TASK_ID"]
    out = Path("many")
    out.mkdir(exist_ok=True)
    for i in range(count):
        (out / f"{task}-{i:05d}.txt").write_text(f"file {i} of {task}\n")
    print(f"{task} wrote {count} files", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
