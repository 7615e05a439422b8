"""Running git in a test: one ``git()`` runner (argv, output captured, failure shown)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(root: Path, *args: str, check: bool = True, env: dict[str, str] | None = None) -> str:
    """``git -C ROOT ARGS``; its stdout as git wrote it (``.strip()`` it for one value).
    With ``check`` (the default) a failing command fails the test with git's stderr."""
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=False, env=env
    )
    if check and done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return done.stdout


def git_show(root: Path, rev_path: str) -> str | None:
    """``git show REV:PATH`` in ``root``, or None when there is no such file."""
    done = subprocess.run(
        ["git", "-C", str(root), "show", rev_path], capture_output=True, text=True, check=False
    )
    return done.stdout if done.returncode == 0 else None
