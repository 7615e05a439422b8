#!/usr/bin/env python3
"""An agent that reports how it was started: argv, cwd and the GRID_* environment, as JSON
in ``REPORT_DIR/<task-id>.env.json``, then exits 0.

    report_env.py REPORT_DIR [ARGS...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    report_dir = Path(sys.argv[1])
    task = os.environ["GRID_TASK_ID"]
    report = {
        "argv": sys.argv[2:],
        "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("GRID_", "EXTRA_"))},
        "pgid": os.getpgid(0),
        "pid": os.getpid(),
        "stdinIsTty": os.isatty(0),
    }
    tmp = report_dir / f"{task}.env.json.tmp"
    tmp.write_text(json.dumps(report))
    tmp.replace(report_dir / f"{task}.env.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
