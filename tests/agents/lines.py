#!/usr/bin/env python3
"""An agent that prints a burst of numbered lines on cue, then waits to be told to end.

    lines.py CONTROL_DIR COUNT

It prints ``<task-id> ready``, waits for ``CONTROL_DIR/go``, prints ``<task-id> line N`` for
N = 1..COUNT as fast as it can (one write each), writes ``CONTROL_DIR/<task-id>.done`` and
waits for ``CONTROL_DIR/end``, then exits 0. Without ``go`` it stays silent.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)


def main() -> int:
    control = Path(sys.argv[1])
    count = int(sys.argv[2])
    task = os.environ["GRID_TASK_ID"]
    print(f"{task} ready", flush=True)
    wait_for(control / "go")
    for n in range(1, count + 1):
        print(f"{task} line {n}", flush=True)
    (control / f"{task}.done").write_text("done")
    wait_for(control / "end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
