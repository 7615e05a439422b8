"""The integration worktrees a merge train gates in: one per candidate gated at once.

With ``[merge] gate_concurrency = N`` the train builds up to N candidates side by side,
each in its own detached worktree (``integration.py``): slot 1 is ``.grid/integration``,
the one the queue always merged in, slot ``k`` is ``.grid/integration-k``. Each is made on
first use and kept (its checkout is the cost of a large repository), scratch: every
candidate resets it. At start the slots past N are removed, whether a daemon with a larger
N left them or one killed while adding them left them half-made, so none lies around (nor
a check a killed daemon left running in one: ``Integration.stop_left_check``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from gridd.git.integration import Integration
from gridd.git.worktrees import Worktrees, git

log = logging.getLogger(__name__)


def slot_path(first: Path, index: int) -> Path:
    """Slot ``index`` (0-based): ``first`` itself, then ``first-2``, ``first-3``, ..."""
    return first if index == 0 else first.with_name(f"{first.name}-{index + 1}")


def slot_number(first: Path, path: Path) -> int | None:
    """The 1-based slot a path beside ``first`` is, or None when it is not one."""
    if path == first:
        return 1
    found = re.fullmatch(re.escape(first.name) + r"-([0-9]+)", path.name)
    return int(found.group(1)) if found and path.parent == first.parent else None


class Slots:
    def __init__(
        self, worktrees: Worktrees, first: Path, *, count: int, git_timeout: float
    ) -> None:
        self.worktrees = worktrees
        self.first = first
        self.timeout = git_timeout
        self.all = [
            Integration(worktrees, slot_path(first, i), git_timeout=git_timeout)
            for i in range(count)
        ]

    def __len__(self) -> int:
        return len(self.all)

    def __getitem__(self, index: int) -> Integration:
        return self.all[index]

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(slot.path for slot in self.all)

    async def sweep(self) -> list[Path]:
        """Remove the slots past the configured count (worktree and directory); returns
        what went. Only at start, before any merge: nothing gates in them then."""
        listed = await git(
            self.worktrees.root, "worktree", "list", "--porcelain", timeout=self.timeout
        )
        first = Path(os.path.realpath(self.first))
        registered = {
            Path(os.path.realpath(line.removeprefix("worktree ")))
            for line in listed.out.splitlines()
            if line.startswith("worktree ")
        }
        try:
            on_disk = set(first.parent.iterdir())
        except OSError:
            on_disk = set()
        stray = sorted(
            path
            for path in registered | on_disk
            if (number := slot_number(first, path)) is not None and number > len(self.all)
        )
        for path in stray:
            Integration(self.worktrees, path, git_timeout=self.timeout).stop_left_check()
            if path in registered:
                # Twice --force: a slot half-made by a killed add is still locked.
                await git(
                    self.worktrees.root,
                    "worktree",
                    "remove",
                    "--force",
                    "--force",
                    "--",
                    str(path),
                    check=False,
                    timeout=self.timeout,
                )
            shutil.rmtree(path, ignore_errors=True)
        if stray:
            await self.worktrees.prune(timeout=self.timeout)
        return stray
