#!/usr/bin/env python3
"""An agent that asks nothing: prints "ready", reads one line from stdin, writes it to
``answer.txt`` in its worktree and exits 0 (for ``POST /agents/{id}/respond`` without a
question)."""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    print("ready for a line", flush=True)
    line = sys.stdin.readline()
    if not line:
        return 3
    Path("answer.txt").write_text(line)
    print("got a line", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
