#!/usr/bin/env python3
"""An agent that points its worktree's ``.git`` file at a repository of its own, whose
config names a file-system monitor hook (``core.fsmonitor``): any git that follows the
file would run the hook. The hook writes MARKER. Then it does its own work and exits 0.
A ``.git`` that is a directory (a sandboxed run's own repository) is removed first.

    gitfile_swap.py MARKER [SECONDS]

It lingers SECONDS (default 0) after the swap, while gridd's radar looks at the worktree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    marker = sys.argv[1]
    worktree = Path.cwd()
    evil = worktree / ".evil"
    subprocess.run(["git", "init", "-q", str(evil)], check=True)
    hook = worktree / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
    hook.chmod(0o755)
    subprocess.run(["git", "-C", str(evil), "config", "core.fsmonitor", str(hook)], check=True)
    if (worktree / ".git").is_dir():
        shutil.rmtree(worktree / ".git")
    (worktree / ".git").write_text(f"gitdir: {evil}/.git\n")
    (worktree / "work.txt").write_text("my work\n")
    print("swapped", flush=True)
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)  # while gridd looks on
    return 0


if __name__ == "__main__":
    sys.exit(main())
