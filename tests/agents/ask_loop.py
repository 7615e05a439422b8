#!/usr/bin/env python3
"""An agent that asks several questions in turn through its heartbeat file and keeps
beating each one (every 0.2 s, without an id) until its answer arrives on stdin, as a
worker following the heartbeat contract may.

    ask_loop.py QUESTION [QUESTION ...]

Each question offers "yes" and "no". The answers go to ``answers.txt``, one a line; then it
exits 0.
"""

from __future__ import annotations

import json
import os
import select
import sys
from pathlib import Path


def beat(obj: dict[str, object]) -> None:
    with open(os.environ["GRID_HEARTBEAT"], "a") as fh:
        fh.write(json.dumps(obj) + "\n")


def ask(question: str) -> str | None:
    while True:
        beat({"status": "question", "question": question, "options": ["yes", "no"]})
        ready, _, _ = select.select([sys.stdin], [], [], 0.2)
        if ready:
            line = sys.stdin.readline()
            return line.rstrip("\n") if line else None


def main(questions: list[str]) -> int:
    print("asking", len(questions), "questions", flush=True)
    answers = []
    for question in questions:
        answer = ask(question)
        if answer is None:
            return 3
        answers.append(answer)
        print(f"{question} -> {answer}", flush=True)
    Path("answers.txt").write_text("".join(a + "\n" for a in answers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
