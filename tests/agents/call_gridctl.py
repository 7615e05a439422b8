#!/usr/bin/env python3
"""An agent that runs ``gridctl ARGS`` where it was started (its worktree), as an agent
calling gridctl would, and reports the result as JSON in ``REPORT_DIR/<task-id>.gridctl.json``.

    call_gridctl.py REPORT_DIR [ARGS...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def main() -> int:
    report_dir = Path(sys.argv[1])
    task = os.environ["GRID_TASK_ID"]
    proc = subprocess.run(
        [sys.executable, "-m", "gridd.cli.gridctl", *sys.argv[2:]],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = {"code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
    tmp = report_dir / f"{task}.gridctl.json.tmp"
    tmp.write_text(json.dumps(report))
    tmp.replace(report_dir / f"{task}.gridctl.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
