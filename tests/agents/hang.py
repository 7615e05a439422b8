#!/usr/bin/env python3
"""An agent that never finishes, with a child process in its process group.

    hang.py PID_DIR

The child ignores SIGTERM (only killing the whole group with SIGKILL ends it). Both pids are
written to ``PID_DIR/<task-id>.pids`` as ``{"agent": pid, "child": pid}`` once the child runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def main() -> int:
    pid_dir = Path(sys.argv[1])
    task = os.environ["GRID_TASK_ID"]
    child = subprocess.Popen([sys.executable, "-c", CHILD])  # same process group as us
    tmp = pid_dir / f"{task}.pids.tmp"
    tmp.write_text(json.dumps({"agent": os.getpid(), "child": child.pid}))
    tmp.replace(pid_dir / f"{task}.pids")
    print(f"hanging on {task} (child {child.pid})", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
