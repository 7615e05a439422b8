"""The bundled example agent: a stand-in for a real coding CLI, so the demo needs nothing.

    python -m gridd.runs.example "PROMPT"

It works in its current directory (the task's worktree): prints progress, writes a notes
file derived from the prompt, commits it, leaves a second file uncommitted (gridd commits
what an agent leaves behind), appends heartbeats when ``GRID_HEARTBEAT`` is set, and exits 0.
``GRID_EXAMPLE_DELAY`` (seconds, default 0.3) paces the steps.

It commits into whatever repository it runs in, so it runs only when gridd started it (in a
task's worktree, with ``GRID_TASK_ID`` set, as gridd sets it for every agent). Run by hand,
it refuses and exits 2, changing nothing; ``--help`` prints its usage and exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _heartbeat(status: str, message: str) -> None:
    path = os.environ.get("GRID_HEARTBEAT")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"status": status, "message": message, "ts": time.time()}) + "\n")


USAGE = (
    "usage: python -m gridd.runs.example PROMPT\n"
    "gridd's bundled example agent: gridd runs it in a task's worktree, where it writes and\n"
    "commits a notes file about PROMPT. It runs only when gridd starts it (GRID_TASK_ID set).\n"
)
EX_USAGE = 2


def main(argv: list[str]) -> int:
    if len(argv) > 1 and argv[1] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    task = os.environ.get("GRID_TASK_ID")
    if not task:
        print(
            "gridd.runs.example: this is gridd's example agent; it commits into the"
            " repository it runs in, so it runs only when gridd starts it for a task"
            " (GRID_TASK_ID is not set). Nothing was changed.",
            file=sys.stderr,
        )
        return EX_USAGE
    prompt = argv[1] if len(argv) > 1 else "(no prompt)"
    delay = float(os.environ.get("GRID_EXAMPLE_DELAY", "0.3"))
    here = Path.cwd()

    def step(message: str) -> None:
        print(f"[example:{task}] {message}", flush=True)
        _heartbeat("working", message)
        time.sleep(delay)

    _heartbeat("started", "reading the prompt")
    step(f"prompt: {prompt}")
    notes = here / "notes" / f"{task}.md"
    notes.parent.mkdir(exist_ok=True)
    notes.write_text(f"# {task}\n\n{prompt}\n\nDone by the gridd example agent.\n")
    step(f"wrote {notes.relative_to(here)}")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "example agent",
        "GIT_AUTHOR_EMAIL": "example@gridd.invalid",
        "GIT_COMMITTER_NAME": "example agent",
        "GIT_COMMITTER_EMAIL": "example@gridd.invalid",
    }
    subprocess.run(["git", "add", "--", str(notes)], check=True, env=env)
    subprocess.run(
        ["git", "commit", "-q", "--no-verify", "-m", f"{task}: notes"], check=True, env=env
    )
    step("committed notes")
    src = here / "src" / f"{task.replace('-', '_').replace('.', '_')}.py"
    src.parent.mkdir(exist_ok=True)
    src.write_text(f'"""Generated for task {task}."""\n\nPROMPT = {prompt!r}\n')
    step(f"wrote {src.relative_to(here)} (left for gridd to commit)")
    _heartbeat("done", f"finished {task}")
    print(f"[example:{task}] done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
