#!/usr/bin/env python3
"""An agent that commits its work itself, twice, and leaves a file uncommitted.

    git_work.py [wait]

It commits ``first.txt`` ("agent: first"); with ``wait`` it then says ``waiting`` and waits
for a file ``go`` in its worktree (a test restarts the daemon meanwhile), which it removes;
then it commits ``second.txt`` ("agent: second"), writes ``left.txt`` without committing it,
and exits 0. A git command that fails ends it with git's exit status.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def commit(name: str, message: str) -> None:
    Path(name).write_text(f"{message}\n")
    subprocess.run(["git", "add", "--", name], check=True)
    subprocess.run(["git", "commit", "-q", "-m", message], check=True)


def main() -> int:
    try:
        commit("first.txt", "agent: first")
        if sys.argv[1:] == ["wait"]:
            print("waiting", flush=True)
            while not Path("go").exists():
                time.sleep(0.02)
            Path("go").unlink()
        commit("second.txt", "agent: second")
    except subprocess.CalledProcessError as exc:
        return exc.returncode or 1
    Path("left.txt").write_text("left uncommitted\n")
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
