#!/usr/bin/env python3
"""Benchmark agent: asks questions through its heartbeat file, one after another.

    ask_loop.py COUNT TIMES_FILE [THINK_SECONDS]

Before each question it pauses a random 0..THINK_SECONDS (default 0; seeded), as an agent
working between questions would: asked straight after an answer, every question would land
at the same point of the daemon's polling cycle and always wait a whole poll interval.
For each question ``i`` (0..COUNT-1) it takes ``time.monotonic()``, appends
``{"status": "question", "id": "q<i>", "question": "question <i>", "options": ["a", "b"]}``
to ``$GRID_HEARTBEAT``, then blocks reading one answer line on stdin and takes the time
again as soon as the line is read. Both stamps go to TIMES_FILE as JSON lines
(``{"i", "asked"}`` after the question is written, ``{"i", "read", "answer"}`` after the
answer is read), so the writes being timed are never delayed by the bookkeeping.
``time.monotonic()`` is one system-wide clock on Linux, so the benchmark compares these
stamps with its own. Exits 0 after the last answer, 3 if stdin closes early.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time


def main(count: int, times_path: str, think: float) -> int:
    heartbeat = os.environ["GRID_HEARTBEAT"]
    rng = random.Random(5)
    with open(times_path, "a") as times:
        for i in range(count):
            time.sleep(rng.uniform(0, think))
            beat = {
                "status": "question",
                "id": f"q{i}",
                "question": f"question {i}",
                "options": ["a", "b"],
            }
            line = json.dumps(beat) + "\n"
            asked = time.monotonic()
            with open(heartbeat, "a") as fh:
                fh.write(line)
            times.write(json.dumps({"i": i, "asked": asked}) + "\n")
            times.flush()
            answer = sys.stdin.readline()
            read = time.monotonic()
            if not answer:
                return 3
            times.write(json.dumps({"i": i, "read": read, "answer": answer.strip()}) + "\n")
            times.flush()
    print(f"asked {count} questions", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.0))
