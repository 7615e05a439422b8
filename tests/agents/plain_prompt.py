#!/usr/bin/env python3
"""A plain CLI that asks on a line it leaves open, as many do.

    plain_prompt.py PROMPT

It prints some ordinary output (a line ending in "?", a numbered progress line), then
PROMPT with no newline, reads one line from stdin, writes it to ``answer.txt`` and exits 0.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    sys.stdout.write("Is this the real life?\n[1/2] checking\n[2/2] done\n")
    sys.stdout.write(argv[1])
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        return 3
    Path("answer.txt").write_text(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
