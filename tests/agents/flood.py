#!/usr/bin/env python3
"""An agent that floods its output: MEGABYTES of text (ASCII with some multi-byte
characters), as fast as it can, then exits 0.

    flood.py MEGABYTES REPORT_DIR

When done it writes ``REPORT_DIR/<task-id>.json``: ``{"bytes": written, "seconds": elapsed}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# 64 bytes per line: a 3-byte and a 4-byte character, so chunk boundaries fall inside them.
LINE = ("flood \u20ac \U0001f600 " + "x" * 48).encode()[:63] + b"\n"


def main() -> int:
    total = int(float(sys.argv[1]) * 1024 * 1024)
    report_dir = Path(sys.argv[2])
    task = os.environ["GRID_TASK_ID"]
    block = LINE * 1024  # 64 KiB
    started = time.monotonic()
    written = 0
    out = sys.stdout.buffer
    while written < total:
        piece = block[: total - written]
        out.write(piece)
        written += len(piece)
    out.flush()
    elapsed = time.monotonic() - started
    tmp = report_dir / f"{task}.json.tmp"
    tmp.write_text(json.dumps({"bytes": written, "seconds": elapsed}))
    tmp.replace(report_dir / f"{task}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
