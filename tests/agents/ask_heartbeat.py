#!/usr/bin/env python3
"""An agent that asks a human through its heartbeat file and acts on the answer.

    ask_heartbeat.py [--exit-without-answer] [--work SECONDS] [QUESTION [OPTION ...]]

It appends ``{"status": "question", "question": QUESTION, "options": [...]}`` to
``$GRID_HEARTBEAT``, then blocks reading one line from stdin, writes that line to
``answer.txt`` in its worktree and exits 0. With ``--exit-without-answer`` it asks, waits
half a second and exits 0 without reading stdin (its question is left open). With
``--work SECONDS`` it stays silent that long after the answer before acting on it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def beat(obj: dict[str, object]) -> None:
    with open(os.environ["GRID_HEARTBEAT"], "a") as fh:
        fh.write(json.dumps(obj) + "\n")


def main(argv: list[str]) -> int:
    leave = "--exit-without-answer" in argv
    words = [a for a in argv if a != "--exit-without-answer"]
    work = 0.0
    if "--work" in words:
        at = words.index("--work")
        work = float(words[at + 1])
        del words[at : at + 2]
    question = words[0] if words else "Which color?"
    options = words[1:] if len(words) > 1 else ["red", "blue"]
    beat({"status": "running", "message": "about to ask"})
    print(f"asking: {question}", flush=True)
    beat({"status": "question", "question": question, "options": options})
    if leave:
        time.sleep(0.5)
        print("leaving without an answer", flush=True)
        return 0
    line = sys.stdin.readline()
    if not line:
        print("stdin closed before an answer", flush=True)
        return 3
    time.sleep(work)
    answer = line.rstrip("\n")
    Path("answer.txt").write_text(answer + "\n")
    print(f"got answer {answer!r}", flush=True)
    beat({"status": "done", "message": f"answered {answer}"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
