#!/usr/bin/env python3
"""An agent driven by its argv: heartbeat lines, output and an exit code, per session.

    beats.py REPORT_DIR ACTION...

Each run first appends one JSON line to ``REPORT_DIR/<task-id>.runs.jsonl``: its session,
attempt, argv (the prompt is in it), cwd, branch, pid and the text of the file named by
``GRID_PREVIOUS_FAILURE`` (null without one). Then it performs the ACTIONs in order:

    say:TEXT            print TEXT
    lines:N             print ``line 1`` ... ``line N``
    note:TEXT           nothing (a place for ``{prompt}``, which then shows in the report)
    beat:JSON           append JSON (one object) to $GRID_HEARTBEAT
    sleep:SECONDS       sleep
    exit:CODE           exit with CODE (the default at the end is 0)
    once:ACTION         perform ACTION only on this task's first run (``<task>.once`` marker)

``{now+N}`` inside a beat is replaced by the epoch time N seconds from now, ``{session}``
anywhere by the session number.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


def expand(text: str) -> str:
    text = text.replace("{session}", os.environ.get("GRID_SESSION", "?"))
    return re.sub(r"\{now\+(\d+(?:\.\d+)?)\}", lambda m: str(time.time() + float(m[1])), text)


def report(report_dir: Path, task: str) -> None:
    previous = os.environ.get("GRID_PREVIOUS_FAILURE")
    branch = subprocess.run(
        ["git", "rev-parse", "--abbrev-ref", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    entry = {
        "session": int(os.environ.get("GRID_SESSION", "0")),
        "attempt": int(os.environ.get("GRID_ATTEMPT", "0")),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "branch": branch,
        "pid": os.getpid(),
        "at": time.time(),
        "monotonic": time.monotonic(),
        "previousFailure": Path(previous).read_text() if previous else None,
    }
    with (report_dir / f"{task}.runs.jsonl").open("a") as fh:
        fh.write(json.dumps(entry) + "\n")


def main() -> int:
    report_dir = Path(sys.argv[1])
    task = os.environ["GRID_TASK_ID"]
    report(report_dir, task)
    once = report_dir / f"{task}.once"
    first = not once.exists()
    once.touch()
    for action in sys.argv[2:]:
        if action.startswith("once:"):
            if not first:
                continue
            action = action[len("once:") :]
        kind, _, arg = action.partition(":")
        if kind == "say":
            print(expand(arg), flush=True)
        elif kind == "lines":
            print("".join(f"line {n}\n" for n in range(1, int(arg) + 1)), end="", flush=True)
        elif kind == "note":
            pass
        elif kind == "beat":
            with open(os.environ["GRID_HEARTBEAT"], "a") as fh:
                fh.write(json.dumps(json.loads(expand(arg))) + "\n")
        elif kind == "sleep":
            time.sleep(float(arg))
        elif kind == "exit":
            return int(arg)
        else:
            raise SystemExit(f"unknown action {action!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
