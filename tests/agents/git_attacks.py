#!/usr/bin/env python3
"""An agent that does its own work with git itself, then turns git against the repository.

    git_attacks.py REPO OTHER_WORKTREE MARKER

It first waits for ``unsaved.txt`` in OTHER_WORKTREE: another task's work, not committed.
Its own work, in its worktree: a commit ("agent: first"), a branch ``side`` from the commit
before it with a commit of its own ("agent: side"), the first rebased onto it, ``side``
deleted. Any of that failing ends the run (exit 1). Then the attacks, each ``allowed`` or
``denied`` (what came of it is judged from the repository, never from git's exit status):

- ``repoint``: its ``.git`` pointed at the repository's, then a file added and committed: the
  user's index and ``main`` would take them. Its own ``.git`` is put back after;
- ``orphan_main``: ``main`` moved to a commit of no history (in its own repository, and in
  the repository's by ``--git-dir``);
- ``remove_worktree``: ``git worktree remove --force`` on OTHER_WORKTREE, another task's;
- ``filter_driver``: a filter driver (``clean`` and ``smudge``) written into the git config its
  git uses and the repository's, named for every file by a committed ``.gitattributes``, and
  hooks written into the hooks directory its git uses and the repository's. The driver and
  the hooks append to MARKER when run outside an agent (no ``GRID_TASK_ID``): by gridd's git.

The results are written to ``attacks.json`` in its worktree (committed by gridd with what else
it left), and it exits 0. Nothing is undone: a test's repository is thrown away.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HOOKS = ("post-commit", "post-merge", "post-checkout", "post-rewrite", "reference-transaction")


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False)


def must(*args: str) -> None:
    done = git(*args)
    if done.returncode != 0:
        print(f"git {' '.join(args)} failed: {done.stderr}", flush=True)
        sys.exit(1)


def commit(name: str, message: str, text: str = "") -> None:
    Path(name).write_text(text or f"{message}\n")
    must("add", "--", name)
    must("commit", "-q", "-m", message)


def own_work() -> None:
    branch = git("symbolic-ref", "--short", "HEAD").stdout.strip()
    commit("first.txt", "agent: first")
    must("checkout", "-q", "-b", "side", "HEAD~1")
    commit("side.txt", "agent: side")
    must("checkout", "-q", branch)
    must("rebase", "-q", "side")
    must("branch", "-q", "-D", "side")


class Attacks:
    def __init__(self, repo: Path, other: Path, marker: Path) -> None:
        self.repo, self.other, self.marker = repo, other, marker
        self.theirs = ("--git-dir", str(repo / ".git"))

    def main(self) -> str:
        return git(*self.theirs, "rev-parse", "--verify", "-q", "refs/heads/main").stdout.strip()

    def repoint(self) -> str:
        before = self.main()
        dotgit, saved = Path(".git"), Path(".git-saved")
        dotgit.rename(saved)
        try:
            dotgit.write_text(f"gitdir: {self.repo / '.git'}\n")
            Path("repoint.txt").write_text("onto main\n")
            git("add", "repoint.txt")
            git("commit", "-q", "-m", "attack: onto main")
        finally:
            dotgit.unlink()
            saved.rename(dotgit)
            Path("repoint.txt").unlink(missing_ok=True)
        return "allowed" if self.main() != before else "denied"

    def orphan_main(self) -> str:
        empty = git("hash-object", "-t", "tree", "/dev/null").stdout.strip()
        orphan = git(*self.theirs, "commit-tree", empty, "-m", "orphan").stdout.strip()
        if not orphan:  # the repository's objects are not ours to write: in our own
            orphan = git("commit-tree", empty, "-m", "orphan").stdout.strip()
        git("update-ref", "refs/heads/main", orphan)
        git(*self.theirs, "update-ref", "refs/heads/main", orphan)
        return "allowed" if orphan and self.main() == orphan else "denied"

    def remove_worktree(self) -> str:
        git("worktree", "remove", "--force", str(self.other))
        git(*self.theirs, "worktree", "remove", "--force", str(self.other))
        return "denied" if self.other.is_dir() else "allowed"

    def filter_driver(self) -> str:
        quiet = f'test -n "$GRID_TASK_ID" || echo {{}} >> {shlex.quote(str(self.marker))}'
        driver = f"{quiet.format('filter')}; cat"
        for where in ((), self.theirs):
            git(*where, "config", "filter.gridattack.clean", driver)
            git(*where, "config", "filter.gridattack.smudge", driver)
        commit(".gitattributes", "agent: attributes", "* filter=gridattack\n")
        ours = Path(git("rev-parse", "--git-path", "hooks").stdout.strip())
        for hooks in {ours.resolve(), (self.repo / ".git" / "hooks").resolve()}:
            for name in HOOKS:
                try:
                    hooks.mkdir(parents=True, exist_ok=True)
                    (hooks / name).write_text(f"#!/bin/sh\n{quiet.format('hook')}\nexit 0\n")
                    (hooks / name).chmod(0o755)
                except OSError:
                    continue
        written = git(*self.theirs, "config", "--get", "filter.gridattack.clean")
        return "allowed" if written.stdout.strip() else "denied"


def main() -> int:
    repo, other, marker = (Path(a) for a in sys.argv[1:4])
    assert os.environ.get("GRID_TASK_ID"), "run me as a gridd agent"
    deadline = time.monotonic() + 30
    while not (other / "unsaved.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the other task's agent, with work not committed yet
    own_work()
    attacks = Attacks(repo, other, marker)
    results = {
        "repoint": attacks.repoint(),
        "orphan_main": attacks.orphan_main(),
        "remove_worktree": attacks.remove_worktree(),
        "filter_driver": attacks.filter_driver(),
    }
    print("attacks:", json.dumps(results, sort_keys=True), flush=True)
    Path("attacks.json").write_text(json.dumps(results, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
