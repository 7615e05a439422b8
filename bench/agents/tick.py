#!/usr/bin/env python3
"""Benchmark agent: a tiny ticker, quiet or printing one line a second, as told.

    tick.py CONTROL_DIR

It prints ``ready``, then once a second looks at ``CONTROL_DIR/ticking``: while that file
exists it prints ``tick <time.monotonic()>`` (the write's own stamp, one system-wide clock
on Linux, so the benchmark can time write -> SSE event), otherwise nothing. A random phase
spreads the agents' seconds. ``CONTROL_DIR/stop`` ends it (exit 0).
"""

from __future__ import annotations

import os
import random
import sys
import time


def main() -> int:
    control = sys.argv[1]
    ticking, stop = os.path.join(control, "ticking"), os.path.join(control, "stop")
    print("ready", flush=True)
    time.sleep(random.random())
    while not os.path.exists(stop):
        if os.path.exists(ticking):
            print(f"tick {time.monotonic():.6f}", flush=True)
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
