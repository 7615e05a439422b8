#!/usr/bin/env python3
"""An agent whose children try to escape its process group, then hangs or exits.

    escapees.py PID_DIR hang|exit

It starts three processes that ignore SIGTERM: one in a session of its own (``setsid()``),
one in a process group of its own (``setpgid()``), and one double-forked daemon in a new
session whose parent exits at once (an orphan). Their pids are written to
``PID_DIR/<task-id>.escapees`` (a JSON list) once all three run; then the agent hangs until
stopped, or exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SLEEPER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"


def _orphan(pid_file: Path) -> None:
    """Fork a daemon (new session, parent gone) that writes its pid to ``pid_file``."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            pid_file.write_text(str(os.getpid()))
            os.execv(sys.executable, [sys.executable, "-c", SLEEPER])
        os._exit(0)


def main() -> int:
    pid_dir, mode = Path(sys.argv[1]), sys.argv[2]
    task = os.environ["GRID_TASK_ID"]
    session = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True)
    group = subprocess.Popen([sys.executable, "-c", SLEEPER], process_group=0)
    orphan_file = pid_dir / f"{task}.orphan"
    _orphan(orphan_file)
    while not orphan_file.exists() or not orphan_file.read_text():
        time.sleep(0.01)
    pids = [session.pid, group.pid, int(orphan_file.read_text())]
    tmp = pid_dir / f"{task}.escapees.tmp"
    tmp.write_text(json.dumps(pids))
    tmp.replace(pid_dir / f"{task}.escapees")
    print(f"{task}: children {pids} are running", flush=True)
    if mode == "exit":
        return 0
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
