"""The integration worktree: where a task's branch meets the feature branch's tip.

One detached worktree under ``.grid/integration`` (never the user's checkout, never with
the feature branch checked out): each merge starts by resetting it to the feature branch's
tip, merges the task's branch there with the configured strategy, and optionally runs the
gate check on the result. Nothing here moves a branch: the queue does that afterwards, by
compare-and-swap, so a merge that is abandoned half-way leaves no trace but this scratch
directory, which the next merge resets.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from gridd.worktrees import Worktrees, git

#: How much of a failing check's output is kept (its tail).
CHECK_TAIL_BYTES = 8000


@dataclass(frozen=True)
class Merged:
    commit: str  # the new feature branch commit (== the tip when nothing was new)


@dataclass(frozen=True)
class Conflicted:
    files: list[str]


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    output: str  # its tail
    exit_code: int | None  # None: killed at the timeout


def merge_message(strategy: str, task_id: str, title: str) -> str:
    verb = {"merge": "merge", "squash": "squash", "rebase": "rebase"}.get(strategy, "merge")
    return f"gridd: {verb} task {task_id}: {title}"[:500] + f"\n\nGrid-Task: {task_id}\n"


class Integration:
    def __init__(self, worktrees: Worktrees, path: Path) -> None:
        self.worktrees = worktrees
        self.root = worktrees.root
        self.path = path

    async def reset(self, tip: str) -> None:
        """The worktree, clean and detached at ``tip`` (created when missing)."""
        if not (self.path / ".git").exists():
            await git(self.root, "worktree", "prune")
            if self.path.exists() and not any(self.path.iterdir()):
                self.path.rmdir()
            await git(self.root, "worktree", "add", "--detach", "--", str(self.path), tip)
            return
        for abort in (("merge", "--abort"), ("rebase", "--abort"), ("cherry-pick", "--abort")):
            await git(self.path, *abort, check=False)
        await git(self.path, "reset", "-q", "--hard")
        await git(self.path, "clean", "-q", "-fdx")
        await git(self.path, "checkout", "-q", "--detach", tip, "--")

    async def head(self) -> str:
        return (await git(self.path, "rev-parse", "--verify", "HEAD^{commit}")).out.strip()

    async def unmerged(self) -> list[str]:
        res = await git(self.path, "diff", "--name-only", "--diff-filter=U", check=False)
        return sorted({line for line in res.out.splitlines() if line})

    async def merge(
        self, *, tip: str, branch: str, strategy: str, task_id: str, title: str
    ) -> Merged | Conflicted:
        """Merge ``branch`` onto ``tip`` here; the worktree is left at the result (or at
        ``tip`` after a conflict, aborted)."""
        await self.reset(tip)
        identity = await self.worktrees.identity()
        message = merge_message(strategy, task_id, title)
        ref = f"refs/heads/{branch}"
        if strategy == "rebase":
            await git(self.path, "checkout", "-q", "--detach", ref, "--")
            res = await git(self.path, *identity, "rebase", "-q", tip, check=False)
            if res.code != 0:
                files = await self.unmerged()
                await self.reset(tip)
                return Conflicted(files or ["(rebase failed)"])
            return Merged(await self.head())
        if strategy == "squash":
            res = await git(self.path, *identity, "merge", "-q", "--squash", ref, check=False)
            if res.code != 0:
                files = await self.unmerged()
                await self.reset(tip)
                return Conflicted(files or ["(merge failed)"])
            staged = await git(self.path, "diff", "--cached", "--quiet", check=False)
            if staged.code == 0:
                return Merged(tip)  # nothing new
            await git(self.path, *identity, "commit", "-q", "--no-verify", "-m", message)
            return Merged(await self.head())
        res = await git(
            self.path,
            *identity,
            "merge",
            "-q",
            "--no-ff",
            "--no-edit",
            "-m",
            message,
            ref,
            check=False,
        )
        if res.code != 0:
            files = await self.unmerged()
            await self.reset(tip)
            return Conflicted(files or ["(merge failed)"])
        return Merged(await self.head())

    async def check(self, argv: list[str], timeout: float) -> CheckResult:
        """Run the gate command on the merged result in this worktree."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(self.path),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        tail = bytearray()

        async def drain() -> None:
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(65536):
                tail.extend(chunk)
                del tail[:-CHECK_TAIL_BYTES]

        try:
            await asyncio.wait_for(asyncio.gather(drain(), proc.wait()), timeout)
        except TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            text = tail.decode(errors="replace")
            return CheckResult(False, text + f"\n(check killed after {timeout:g}s)", None)
        except asyncio.CancelledError:
            _kill_group(proc.pid)
            await asyncio.shield(proc.wait())
            raise
        code = proc.returncode or 0
        return CheckResult(code == 0, tail.decode(errors="replace"), code)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
