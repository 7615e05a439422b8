#!/usr/bin/env python3
"""An agent that always fails: prints to stderr and exits with CODE (default 3).

fail.py [CODE]
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    code = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    attempt = os.environ.get("GRID_ATTEMPT", "?")
    print(f"failing on purpose (attempt {attempt}, exit {code})", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
