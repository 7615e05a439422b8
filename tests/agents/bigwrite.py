#!/usr/bin/env python3
"""An agent that writes MEGABYTES of numbered lines once told to, then exits 0.

    bigwrite.py CONTROL_DIR MEGABYTES

It writes its pid to ``CONTROL_DIR/<task-id>.pid`` and waits for ``CONTROL_DIR/<task-id>.go``.
Then it writes exactly MEGABYTES MiB to stdout (``expected_output(MEGABYTES)`` below: the
test recomputes it), and ``CONTROL_DIR/<task-id>.done`` with ``{"bytes": n, "at": epoch}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def expected_output(megabytes: float) -> bytes:
    total = int(megabytes * 1024 * 1024)
    lines = b"".join(
        b"line %09d \xe2\x82\xac %s\n" % (i, b"y" * 40) for i in range(total // 40 + 1)
    )
    return lines[:total]


def main() -> int:
    control = Path(sys.argv[1])
    megabytes = float(sys.argv[2])
    task = os.environ["GRID_TASK_ID"]
    (control / f"{task}.pid").write_text(str(os.getpid()))
    while not (control / f"{task}.go").exists():
        time.sleep(0.02)
    data = expected_output(megabytes)
    out = sys.stdout.buffer
    for start in range(0, len(data), 65536):
        out.write(data[start : start + 65536])
        out.flush()
    tmp = control / f"{task}.done.tmp"
    tmp.write_text(json.dumps({"bytes": len(data), "at": time.time()}))
    tmp.replace(control / f"{task}.done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
