#!/usr/bin/env python3
"""An agent that tries to hurt the machine, then does its own work, and exits 0.

    sandbox_attacks.py OUTSIDE REPO OTHER_WORKTREE [wait]

With ``wait``, it first says ``waiting`` and waits for a file ``go`` in its worktree (a test
restarts the daemon meanwhile), which it removes.
It tries each attack itself, then has a grandchild (double-forked into a session of its
own, left behind) try them all again. What came of each (``denied`` or ``allowed``) is
written into its worktree: ``attacks.json`` (its own) and ``grandchild.json``, which gridd
commits and merges like any work. Nothing it manages to create is left in place: an
unsandboxed run (the test's control) undoes each attack that succeeded.

The attacks: write ``~/x``, a file in OUTSIDE (a directory outside the worktree),
``/etc/gridd-sandbox-test``, a file in another task's worktree, ``.grid/gridd.db``, the
repository's ``.git/config`` and a hook; read ``~/.ssh/id_test``; write OUTSIDE through a
symbolic link planted in the worktree, and through a hard link made there.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _create(path: Path) -> str:
    """Make a new file (and remove it again if that worked)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return "denied"
    os.close(fd)
    path.unlink()
    return "allowed"


def _open_for_writing(path: Path) -> str:
    """Open an existing file for writing, and write nothing (a database stays intact)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError:
        return "denied"
    return "allowed"


def _read(path: Path) -> str:
    try:
        path.read_bytes()
    except OSError:
        return "denied"
    return "allowed"


def _through_symlink(worktree: Path, outside: Path, name: str) -> str:
    link = worktree / f"{name}.link"
    target = outside / f"{name}.target"
    try:
        link.symlink_to(target)
    except OSError:
        return "denied"
    try:
        fd = os.open(link, os.O_WRONLY | os.O_CREAT, 0o600)  # follows the link
    except OSError:
        return "denied"
    finally:
        link.unlink()
    os.close(fd)
    target.unlink()
    return "allowed"


def _through_hardlink(worktree: Path, outside: Path, name: str) -> str:
    victim = outside / "victim.txt"
    link = worktree / f"{name}.hardlink"
    try:
        os.link(victim, link)
    except OSError:
        return "denied"
    try:
        return _open_for_writing(link)
    finally:
        link.unlink()


def attacks(who: str, outside: Path, repo: Path, other: Path) -> dict[str, str]:
    worktree = Path.cwd()
    home = Path(os.environ["HOME"])
    return {
        "home": _create(home / f"x-{who}"),
        "outside": _create(outside / f"x-{who}"),
        "etc": _create(Path("/etc/gridd-sandbox-test")),
        "other_worktree": _create(other / f"x-{who}"),
        "db": _open_for_writing(repo / ".grid" / "gridd.db"),
        "git_config": _open_for_writing(repo / ".git" / "config"),
        "git_hook": _create(repo / ".git" / "hooks" / "post-commit"),
        "ssh_key": _read(home / ".ssh" / "id_test"),
        "symlink": _through_symlink(worktree, outside, who),
        "hardlink": _through_hardlink(worktree, outside, who),
    }


def _write_result(path: Path, result: dict[str, str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, sort_keys=True) + "\n")
    tmp.replace(path)


def main() -> int:
    outside, repo, other = (Path(a) for a in sys.argv[1:4])
    deadline = time.monotonic() + 30
    while not other.is_dir() and time.monotonic() < deadline:  # the other task's worktree
        time.sleep(0.05)
    worktree = Path.cwd()
    if sys.argv[4:] == ["wait"]:
        print("waiting", flush=True)
        while not (worktree / "go").exists():
            time.sleep(0.02)
        (worktree / "go").unlink()
    mine = attacks("agent", outside, repo, other)
    print("agent:", json.dumps(mine, sort_keys=True), flush=True)
    _write_result(worktree / "attacks.json", mine)
    if os.fork() == 0:  # the grandchild: its own session, its parent gone, left behind
        os.setsid()
        if os.fork() == 0:
            theirs = attacks("grandchild", outside, repo, other)
            print("grandchild:", json.dumps(theirs, sort_keys=True), flush=True)
            _write_result(worktree / "grandchild.json", theirs)
            time.sleep(600)
        os._exit(0)
    while not (worktree / "grandchild.json").exists():
        time.sleep(0.02)
    return 0


if __name__ == "__main__":
    sys.exit(main())
