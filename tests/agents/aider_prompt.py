#!/usr/bin/env python3
"""A tiny interactive CLI that prompts exactly as aider does, on a line it leaves open.

    aider_prompt.py [--decoy] [--twice]

It prints the prompt's subject (a file name) on one line, then aider's confirm prompt
``Add file to the chat? (Y)es/(N)o/(A)ll/(S)kip all/(D)on't ask again [Yes]: `` with no
newline, reads one line from stdin, writes what it read to ``answer.txt`` and exits 0.

With ``--decoy`` it first leaves a line ending in "?" open for a while (text that merely
looks like a question), then finishes it, before the real prompt. With ``--twice`` it asks
about ``notes.txt`` and then about ``todo.txt`` (``answer.txt`` holds both answers).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

PROMPT = "Add file to the chat? (Y)es/(N)o/(A)ll/(S)kip all/(D)on't ask again [Yes]: "


def say(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    say("Aider v0.0.0-fake\nMain model: fake\n")
    if "--decoy" in argv:
        say("Should I refactor the whole module while I am at it?")
        time.sleep(0.8)  # long enough for the daemon to read the open line several times
        say("\nI will not.\n")
    answers = []
    for subject in ("notes.txt", "todo.txt") if "--twice" in argv else ("notes.txt",):
        say(f"{subject}\n")
        say(PROMPT)
        line = sys.stdin.readline()
        if not line:
            return 3
        answers.append(line)
        say(f"\nreceived {line.strip()!r}\n")
    Path("answer.txt").write_text("".join(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
