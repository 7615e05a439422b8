"""The integration worktree: where a task's branch meets the feature branch's tip.

One detached worktree under ``.grid/integration`` (never the user's checkout, never with
the feature branch checked out): each merge starts by resetting it to the feature branch's
tip, merges the task's branch there with the configured strategy, and optionally runs the
gate check on the result. Nothing here moves a branch: the queue does that afterwards, by
compare-and-swap, so a merge that is abandoned half-way leaves no trace but this scratch
directory, which the next merge resets.

A check runs in its own session, so it outlives a daemon killed during it. Its pid and
start time are kept in the worktree's git directory (``gridd-check``) while it runs: the
next daemon to use the worktree stops that process group first (the same process, by its
start time: a pid used again since is left alone), so no stray check runs beside the next.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from gridd.git.worktrees import GitResult, Worktrees, git

log = logging.getLogger(__name__)

#: How much of a failing check's output is kept (its tail).
CHECK_TAIL_BYTES = 8000
#: In the worktree's git directory while a check runs: its pid and start time.
CHECK_MARK = "gridd-check"


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
    def __init__(self, worktrees: Worktrees, path: Path, *, git_timeout: float) -> None:
        self.worktrees = worktrees
        self.root = worktrees.root
        self.path = path
        self.git_timeout = git_timeout
        #: Untracked files may lie around (a check ran, a merge failed, or we just started).
        self._untidy = True

    async def _git(self, cwd: Path, *args: str, check: bool = True) -> GitResult:
        """git, bounded: a filter or hook that hangs fails the merge, not the queue."""
        return await git(cwd, *args, check=check, timeout=self.git_timeout)

    def _git_dir(self) -> Path | None:
        """The worktree's own git directory (``.git`` is a ``gitdir:`` file)."""
        try:
            text = (self.path / ".git").read_text()
        except OSError:
            return None
        gitdir = Path(text.removeprefix("gitdir:").strip())
        return gitdir if gitdir.is_absolute() else self.path / gitdir

    def stop_left_check(self) -> bool:
        """Stop the check a daemon killed during it left running here (its process group);
        True when there was one."""
        gitdir = self._git_dir()
        if gitdir is None:
            return False
        mark = gitdir / CHECK_MARK
        try:
            pid_text, started_text = mark.read_text().split()
            pid, started = int(pid_text), float(started_text)
        except (OSError, ValueError):
            return False
        mark.unlink(missing_ok=True)
        import psutil  # here: only a daemon killed mid-check left a mark; at rest none is needed

        try:
            same = abs(psutil.Process(pid).create_time() - started) < 0.01
        except psutil.Error:
            return False
        if same:
            log.warning("stopped a check left running in %s (pid %d)", self.path, pid)
            _kill_group(pid)
        return same

    def _mark_check(self, pid: int | None) -> None:
        gitdir = self._git_dir()
        if gitdir is None:
            return
        mark = gitdir / CHECK_MARK
        import psutil  # here, not at start-up: only a running gate's check needs it

        try:
            if pid is None:
                mark.unlink(missing_ok=True)
            else:
                mark.write_text(f"{pid} {psutil.Process(pid).create_time()}\n")
        except (OSError, psutil.Error):
            pass  # only a stray check's stop depends on it

    async def reset(self, tip: str) -> None:
        """The worktree, clean and detached at ``tip`` (created when missing)."""
        if not (self.path / ".git").exists():
            await self.worktrees.prune(timeout=self.git_timeout)
            if self.path.exists() and not any(self.path.iterdir()):
                self.path.rmdir()
            await self.worktrees.add(
                "--detach", "--", str(self.path), tip, timeout=self.git_timeout
            )
            self._untidy = False
            return
        self.stop_left_check()
        gitdir = self._git_dir()
        if gitdir is not None:
            # Only the queue runs git here, one call at a time: a lock left now is a stopped
            # git's (a timeout's SIGKILL), and would refuse every later merge.
            (gitdir / "index.lock").unlink(missing_ok=True)
        for marker, abort in (
            ("MERGE_HEAD", "merge"),
            ("rebase-merge", "rebase"),
            ("rebase-apply", "rebase"),
            ("CHERRY_PICK_HEAD", "cherry-pick"),
        ):
            if gitdir is None or (gitdir / marker).exists():
                await self._git(self.path, abort, "--abort", check=False)
        # HEAD is always detached here: a hard reset moves it to tip and cleans the index.
        await self._git(self.path, "reset", "-q", "--hard", tip, "--")
        if self._untidy:
            await self._git(self.path, "clean", "-q", "-fdx")
            self._untidy = False

    async def ready_at(self, commit: str) -> None:
        """The worktree clean at ``commit`` for a gate run: made, reset or cleaned only as
        needed (a merge that just ended here at ``commit`` leaves it so)."""
        if self._untidy or not (self.path / ".git").exists() or await self.head() != commit:
            await self.reset(commit)

    async def head(self) -> str:
        return (await self._git(self.path, "rev-parse", "--verify", "HEAD^{commit}")).out.strip()

    async def unmerged(self) -> list[str]:
        res = await self._git(self.path, "diff", "--name-only", "--diff-filter=U", check=False)
        return sorted({line for line in res.out.splitlines() if line})

    async def merge(
        self, *, tip: str, branch: str, strategy: str, task_id: str, title: str
    ) -> Merged | Conflicted:
        """Merge ``branch`` onto ``tip`` here; the worktree is left at the result (or at
        ``tip`` after a conflict, aborted). ``GitTimeout`` when a git call hangs."""
        try:
            return await self._merge(
                tip=tip, branch=branch, strategy=strategy, task_id=task_id, title=title
            )
        except BaseException:
            self._untidy = True  # stopped half-way (a timeout): the next reset cleans up
            raise

    async def _merge(
        self, *, tip: str, branch: str, strategy: str, task_id: str, title: str
    ) -> Merged | Conflicted:
        await self.reset(tip)
        identity = await self.worktrees.identity()
        message = merge_message(strategy, task_id, title)
        ref = f"refs/heads/{branch}"
        if strategy == "rebase":
            await self._git(self.path, "checkout", "-q", "--detach", ref, "--")
            res = await self._git(self.path, *identity, "rebase", "-q", tip, check=False)
            if res.code != 0:
                files = await self.unmerged()
                self._untidy = True
                await self.reset(tip)
                return Conflicted(files or ["(rebase failed)"])
            return Merged(await self.head())
        if strategy == "squash":
            res = await self._git(self.path, *identity, "merge", "-q", "--squash", ref, check=False)
            if res.code != 0:
                files = await self.unmerged()
                self._untidy = True
                await self.reset(tip)
                return Conflicted(files or ["(merge failed)"])
            staged = await self._git(self.path, "diff", "--cached", "--quiet", check=False)
            if staged.code == 0:
                return Merged(tip)  # nothing new
            await self._git(self.path, *identity, "commit", "-q", "--no-verify", "-m", message)
            return Merged(await self.head())
        res = await self._git(
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
            self._untidy = True
            await self.reset(tip)
            return Conflicted(files or ["(merge failed)"])
        return Merged(await self.head())

    async def check(self, argv: list[str], timeout: float) -> CheckResult:
        """Run the gate command on the merged result in this worktree."""
        self._untidy = True  # it may leave build products behind
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(self.path),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        self._mark_check(proc.pid)
        try:
            return await self._finish(proc, timeout)
        finally:
            self._mark_check(None)

    async def _finish(self, proc: asyncio.subprocess.Process, timeout: float) -> CheckResult:
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
