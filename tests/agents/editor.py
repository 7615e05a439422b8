#!/usr/bin/env python3
"""An agent for the merge tests: edits files as its prompt says, resolves conflicts.

    editor.py LOGDIR PROMPT

The prompt's first line is JSON: ``{"write": {"path": "content", ...}}``. The agent

1. records the files it found at start, and its prompt, in ``LOGDIR/<task>-<n>.json``;
2. resolves any merge conflict left in its worktree by keeping both sides' lines (markers
   removed) and staging the files; with ``"conflicts": "leave"`` in that JSON it leaves
   them as they are, and with ``"conflicts": "add"`` it stages them, markers and all (an
   agent that fails at resolving); with ``"fail_in_conflict": true`` it then exits 3
   while its worktree holds unmerged files;
3. on a first run, writes the files; on a run sent back with feedback (the prompt has a
   ``---`` section), writes ``<task>.feedback.txt`` with the prompt instead.

It never commits: gridd commits what an agent leaves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def listing() -> list[str]:
    out = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout
    return sorted(line for line in out.splitlines() if line)


def resolve_conflicts() -> list[str]:
    out = subprocess.run(
        ["git", "diff", "--name-only", "--diff-filter=U"], capture_output=True, text=True
    ).stdout
    files = [line for line in out.splitlines() if line]
    for name in files:
        kept = [
            line
            for line in Path(name).read_text().splitlines(keepends=True)
            if not line.startswith(("<<<<<<<", "=======", ">>>>>>>"))
        ]
        Path(name).write_text("".join(kept))
        subprocess.run(["git", "add", "--", name], check=True)
    return files


def main() -> int:
    logdir, prompt = Path(sys.argv[1]), sys.argv[2]
    task = os.environ["GRID_TASK_ID"]
    n = 1
    while (logdir / f"{task}-{n}.json").exists():
        n += 1
    spec = json.loads(prompt.splitlines()[0])
    conflicts = spec.get("conflicts", "resolve")
    unmerged = subprocess.run(["git", "ls-files", "-u"], capture_output=True, text=True).stdout
    if conflicts == "add":
        subprocess.run(["git", "add", "-A", "--", "."], check=True)
    resolved = resolve_conflicts() if conflicts == "resolve" else []
    # Written whole, then renamed into place: a test polling for it never reads half of it.
    record = logdir / f"{task}-{n}.json"
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps({"files": listing(), "prompt": prompt, "resolved": resolved}))
    tmp.replace(record)
    if spec.get("fail_in_conflict") and unmerged.strip():
        print(f"editor agent {task} run {n} gives up on the conflict", flush=True)
        return 3
    if "\n---\n" in prompt:
        Path(f"{task}.feedback.txt").write_text(prompt)
    else:
        for path, content in spec.get("write", {}).items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
    print(f"editor agent {task} run {n} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
