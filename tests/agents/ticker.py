#!/usr/bin/env python3
"""An agent that prints numbered lines until told to finish, then exits with CODE.

    ticker.py CONTROL_DIR [INTERVAL] [CODE]

It writes its pid to ``CONTROL_DIR/<task-id>.pid``, then prints ``<task-id> tick N`` every
INTERVAL seconds (default 0.05). Once ``CONTROL_DIR/<task-id>.go`` exists it prints
``<task-id> last tick N``, writes ``CONTROL_DIR/<task-id>.done`` (``{"ticks": N, "at": epoch}``)
and exits with CODE (default 0). It leaves ``<task-id>.txt`` in its worktree.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main() -> int:
    control = Path(sys.argv[1])
    interval = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
    code = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    task = os.environ["GRID_TASK_ID"]
    Path(f"{task}.txt").write_text(f"work for {task}\n")
    write_atomic(control / f"{task}.pid", str(os.getpid()))
    ticks = 0
    while not (control / f"{task}.go").exists():
        ticks += 1
        print(f"{task} tick {ticks}", flush=True)
        time.sleep(interval)
    print(f"{task} last tick {ticks}", flush=True)
    write_atomic(control / f"{task}.done", json.dumps({"ticks": ticks, "at": time.time()}))
    return code


if __name__ == "__main__":
    sys.exit(main())
