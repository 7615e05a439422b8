"""Git worktrees: one worktree and branch per task, and never a lost commit.

Every git call is an argv list with ``--`` before paths or refs that could look like
options. Creating a worktree is idempotent (a retry reuses the task's worktree and branch,
keeping earlier work); removing one with uncommitted changes is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gridd.errors import GriddError
from gridd.ids import task_branch

log = logging.getLogger(__name__)

_IDENTITY = ("-c", "user.name=gridd", "-c", "user.email=gridd@localhost")
#: One ``sh`` runs the git calls of a finish in sequence. Arguments: message, base ("" for none), then identity flags for ``git commit``.
_RECORD_SCRIPT = """set -e
msg=$1; base=$2; shift 2
git add -A -- .
if git diff --cached --quiet --; then echo unchanged; else
  git "$@" commit -q --no-verify -m "$msg"; echo committed; fi
if [ -n "$base" ]; then git diff --name-only "$base..HEAD" --; fi
"""


class GitError(GriddError):
    code = "git_failed"
    transient = True


class WorktreeGone(GitError):
    """A worktree to commit in is not on disk: trying again cannot help."""

    code = "worktree_missing"
    transient = False


@dataclass(frozen=True)
class GitResult:
    code: int
    out: str
    err: str


async def git(
    cwd: Path,
    *args: str,
    check: bool = True,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> GitResult:
    """Run git in ``cwd``. With ``timeout``, a git still running after that many seconds
    is stopped with its whole process group (a filter or hook driver that hangs goes with
    it) and ``GitTimeout`` is raised. ``env``: variables set for this call only."""
    return await _run(cwd, ("git", *args), check=check, timeout=timeout, env=env)


async def branch_tip(root: Path, branch: str, *, timeout: float | None = None) -> str | None:
    """The commit ``branch`` (``refs/heads/<branch>``) points at in the repository at
    ``root``, or None when there is no such branch: the one branch-tip lookup."""
    res = await git(
        root,
        "rev-parse",
        "--verify",
        "--quiet",
        f"refs/heads/{branch}^{{commit}}",
        check=False,
        timeout=timeout,
    )
    return res.out.strip() if res.code == 0 else None


class GitTimeout(GitError):
    """A git call (or what it ran: a filter driver, a hook) outlived its timeout."""

    code = "git_timeout"
    transient = False


#: After SIGTERM (git removes its lock files), how long a timed-out group gets before SIGKILL.
TERM_GRACE_SECONDS = 2.0


def pinned_git_dir(cwd: Path) -> dict[str, str]:
    """``GIT_DIR`` and ``GIT_WORK_TREE`` for git run in a task's worktree
    (``<root>/.grid/worktrees/<name>``): its administrative directory under
    ``<root>/.git/worktrees/``, found from that side, whose ``gitdir`` file names the
    worktree. Never from the worktree's own ``.git`` file: that lies in what the agent
    writes, and one pointed at a repository of the agent's making would have gridd's git
    run that repository's config (``core.fsmonitor``, hooks) outside any sandbox. Empty
    for any other directory (git then finds its repository as usual)."""
    if cwd.parent.name != "worktrees" or cwd.parent.parent.name != ".grid":
        return {}
    admin = cwd.parent.parent.parent / ".git" / "worktrees"
    wanted = os.path.join(os.path.realpath(cwd), ".git")
    try:
        names = sorted(os.listdir(admin), key=lambda n: n != cwd.name)  # its own name first
    except OSError:
        return {}
    for name in names:
        try:
            named = (admin / name / "gitdir").read_text().strip()
        except OSError:
            continue
        if os.path.join(os.path.realpath(os.path.dirname(named)), ".git") == wanted:
            return {"GIT_DIR": str(admin / name), "GIT_WORK_TREE": str(cwd)}
    return {}


async def _run(
    cwd: Path,
    argv: tuple[str, ...],
    *,
    check: bool,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> GitResult:
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
        **pinned_git_dir(cwd),
        **(env or {}),
    }
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(cwd),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        # Its own process group, so that a timeout reaches what git started too.
        start_new_session=timeout is not None,
    )
    try:
        if timeout is None:
            out, err = await proc.communicate()
        else:
            out, err = await _communicate_within(proc, argv, timeout)
    except asyncio.CancelledError:
        # Never leave git running (and holding index.lock) behind a cancelled caller.
        # SIGTERM, not SIGKILL: git removes its lock files when terminated.
        if timeout is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # git and what it started
        elif proc.returncode is None:
            proc.terminate()
        await asyncio.shield(proc.wait())
        raise
    result = GitResult(
        proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
    )
    if check and result.code != 0:
        args = argv[1:]
        raise GitError(
            f"git {' '.join(args[:3])} failed: {result.err.strip() or result.out.strip()}",
            details={"args": list(args), "exitCode": result.code},
        )
    return result


async def _communicate_within(
    proc: asyncio.subprocess.Process, argv: tuple[str, ...], timeout: float
) -> tuple[bytes, bytes]:
    talk = asyncio.ensure_future(proc.communicate())
    try:
        done, _ = await asyncio.wait({talk}, timeout=timeout)
    except asyncio.CancelledError:
        talk.cancel()
        raise
    if done:
        return talk.result()
    await _stop_group(proc, talk)
    what = " ".join(argv[:4]).splitlines()[0][:120]  # ``git merge -q ...``, not a script
    raise GitTimeout(
        f"{what} did not finish within {timeout:g} s and was stopped"
        " (a .gitattributes filter or a hook that hangs?)",
        details={"args": list(argv[1:]), "timeoutSeconds": timeout},
    )


async def _stop_group(
    proc: asyncio.subprocess.Process, talk: asyncio.Future[tuple[bytes, bytes]]
) -> None:
    """SIGTERM the process group (git removes its locks), SIGKILL what is left after a
    grace; then wait for the pipes, which close once nothing of the group holds them."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        done, _ = await asyncio.wait({talk}, timeout=TERM_GRACE_SECONDS)
        if done:
            break
    if not talk.done():
        talk.cancel()  # a grandchild left the group and holds the pipe: stop reading it
        await asyncio.wait({talk})
    if not talk.cancelled():
        talk.exception()  # retrieved: nothing is left unobserved
    await proc.wait()


@dataclass(frozen=True)
class Worktree:
    task_id: str
    path: Path
    branch: str
    base: str  # the commit the branch started from


class Worktrees:
    def __init__(self, root: Path, worktrees_dir: Path) -> None:
        self.root = root
        self.dir = worktrees_dir
        self._identity: tuple[str, ...] | None = None
        #: One ``git worktree add`` at a time: two at once can fail on each other, as git
        #: reads every worktree's ``commondir`` while another add is still writing its own
        #: ("fatal: failed to read .git/worktrees/<name>/commondir: Success", git 2.39).
        self._adding = asyncio.Lock()

    async def add(self, *args: str, check: bool = True, timeout: float | None = None) -> GitResult:
        """``git worktree add ARGS`` in the repository, one at a time."""
        async with self._adding:
            return await git(self.root, "worktree", "add", *args, check=check, timeout=timeout)

    async def prune(self, *, timeout: float | None = None) -> None:
        """``git worktree prune``, never while a ``worktree add`` runs: an add's admin
        directory has no worktree yet, so a prune beside it removes it and the add fails
        ("could not open .git/worktrees/<name>/locked"), as three starts resuming at once
        after a read-only disk did."""
        async with self._adding:
            await git(self.root, "worktree", "prune", timeout=timeout)

    async def setup(self) -> None:
        """Keep ``.grid/`` out of ``git status`` without touching tracked files."""
        info = self.root / ".git" / "info"
        if info.is_dir():
            exclude = info / "exclude"
            text = exclude.read_text() if exclude.exists() else ""
            if ".grid/" not in text.split():
                with exclude.open("a") as fh:
                    fh.write(("" if text.endswith("\n") or not text else "\n") + ".grid/\n")
        self.dir.mkdir(parents=True, exist_ok=True)

    async def identity(self) -> tuple[str, ...]:
        """Commit identity flags, only when the repository has none configured."""
        if self._identity is None:
            res = await git(self.root, "config", "--get", "user.email", check=False)
            self._identity = () if res.out.strip() else _IDENTITY
        return self._identity

    async def branch_exists(self, branch: str) -> bool:
        return await branch_tip(self.root, branch) is not None

    async def head_commit(self, ref: str = "HEAD") -> str:
        return (await git(self.root, "rev-parse", "--verify", f"{ref}^{{commit}}")).out.strip()

    async def ensure_branch(self, branch: str) -> str:
        """The commit of ``branch``, creating it from HEAD when missing."""
        tip = await branch_tip(self.root, branch)
        if tip is not None:
            return tip
        head = await self.head_commit("HEAD")
        made = await git(self.root, "update-ref", f"refs/heads/{branch}", head, "", check=False)
        if made.code != 0:
            # Two tasks starting at once both found it missing: the other one made it.
            return await self.head_commit(f"refs/heads/{branch}")
        log.info("created branch %s at %s", branch, head[:12])
        return head

    async def create(
        self, task_id: str, base_branch: str | None, *, known_base: str | None = None
    ) -> Worktree:
        """The task's worktree on ``grid/<task-id>``, created or reused.

        ``known_base``: the commit the task's branch started from, when the task already has
        one; a worktree still in place is then reused without asking git anything.
        """
        path = self.dir / task_id
        branch = task_branch(task_id)
        if known_base is not None and (path / ".git").exists():
            return Worktree(task_id, path, branch, known_base)
        if known_base is not None and not await self.branch_exists(branch):
            # Worktree and branch both gone (removed by hand, or by an earlier gridd): there
            # is nothing left to go back to, so the run starts afresh from the base branch.
            log.warning("the worktree and branch of %s are gone: starting it afresh", task_id)
            await self.prune()  # (a worktree deleted by hand)
            known_base = None
        if known_base is None:
            base = await (self.ensure_branch(base_branch) if base_branch else self.head_commit())
            if path.exists() and not any(path.iterdir()):
                path.rmdir()
            res = await self.add("-b", branch, "--", str(path), base, check=False)
            if res.code == 0:
                return Worktree(task_id, path, branch, base)
            if not await self.branch_exists(branch):
                raise GitError(
                    f"git worktree add failed: {res.err.strip() or res.out.strip()}",
                    details={"exitCode": res.code, "path": str(path)},
                )
            # The branch outlived what we knew of it: a worktree prepared ahead by an earlier
            # daemon (nothing of its own on it: it starts from ``base`` like a new one), or
            # work kept from a quarantined database (reused as it is).
            if await self._moved_if_pristine(path, branch, base):
                return Worktree(task_id, path, branch, base)
        base = known_base or await self.base_of(branch)
        if not (path / ".git").exists():
            await self.prune()
            await self.add("--", str(path), branch)
        return Worktree(task_id, path, branch, base)

    async def _holds_nothing(self, path: Path, branch: str, base: str) -> bool:
        """The branch has no commit ``base`` lacks, and its worktree (if any) is clean."""
        ref = f"refs/heads/{branch}"
        mb = await git(self.root, "merge-base", "--is-ancestor", ref, base, check=False)
        if mb.code != 0:
            return False
        return not (path / ".git").exists() or not await self.is_dirty(path)

    async def _moved_if_pristine(self, path: Path, branch: str, base: str) -> bool:
        """Move a branch holding nothing of its own (and its worktree) to ``base``."""
        if not await self._holds_nothing(path, branch, base):
            return False
        if (path / ".git").exists():
            await git(path, "reset", "-q", "--hard", base)
        else:
            await self.prune()
            await git(self.root, "branch", "-f", "--", branch, base)
            await self.add("--", str(path), branch)
        return True

    async def pristine(self, task_id: str, base_branch: str | None) -> Worktree | None:
        """A task's worktree on disk with nothing of its own on it (no commit the base
        branch lacks, nothing uncommitted), as a ``Worktree`` based at its branch's tip."""
        path, branch = self.dir / task_id, task_branch(task_id)
        if not (path / ".git").exists():
            return None
        tip = await branch_tip(self.root, branch)
        if tip is None:
            return None
        base = await (self.ensure_branch(base_branch) if base_branch else self.head_commit())
        if not await self._holds_nothing(path, branch, base):
            return None
        return Worktree(task_id, path, branch, tip)

    async def base_of(self, branch: str) -> str:
        """Where ``branch`` forked from HEAD: for a branch the task record has no base for
        (it outlived the database that knew)."""
        mb = await git(self.root, "merge-base", "HEAD", f"refs/heads/{branch}", check=False)
        return mb.out.strip() or await self.head_commit(f"refs/heads/{branch}")

    async def is_dirty(self, path: Path) -> bool:
        return bool(await self.dirty_files(path))

    async def dirty_files(self, path: Path) -> list[str]:
        """The paths with uncommitted changes (untracked ones included), each once."""
        res = await git(path, "status", "--porcelain", "-z", "--untracked-files=all")
        entries = iter(res.out.split("\0"))
        found = set()
        for entry in entries:
            if len(entry) < 4:
                continue
            found.add(entry[3:])
            if entry[0] in "RC":
                next(entries, None)  # a rename's or copy's source path follows
        return sorted(found)

    async def commit_all(self, path: Path, message: str, *, timeout: float | None = None) -> bool:
        """Commit everything left in the worktree; False when there was nothing."""
        committed, _ = await self.record(path, message, timeout=timeout)
        return committed

    async def record(
        self,
        path: Path,
        message: str,
        *,
        base: str | None = None,
        identity: tuple[str, ...] | None = None,
        timeout: float | None = None,
    ) -> tuple[bool, list[str]]:
        """Commit everything left in the worktree and, given ``base``, list the files the
        branch changed since it: the git calls of a finish in one process (a finish used to
        start four). Returns (whether a commit was made, changed files). Safe to repeat.
        ``identity``: ``-c user.*`` flags for the commit (default: ``identity()``)."""
        if not path.is_dir():  # else the spawn's cwd fails with a bare FileNotFoundError
            raise WorktreeGone(
                f"the worktree {path} is gone: nothing left in it can be recorded",
                details={"path": str(path)},
            )
        identity = await self.identity() if identity is None else identity
        argv = ("sh", "-c", _RECORD_SCRIPT, "gridd-record", message, base or "", *identity)
        res = await _run(path, argv, check=False, timeout=timeout)
        if res.code != 0:
            raise GitError(
                f"recording the work in {path} failed: {res.err.strip() or res.out.strip()}",
                details={"exitCode": res.code, "path": str(path)},
            )
        first, _, rest = res.out.partition("\n")
        return first.strip() == "committed", sorted(ln for ln in rest.splitlines() if ln)

    async def changed_files(self, path: Path, base: str) -> list[str]:
        res = await git(path, "diff", "--name-only", f"{base}..HEAD", "--")
        return sorted(line for line in res.out.splitlines() if line)

    async def set_aside(self, worktree: Worktree, keep_as: str, message: str) -> str | None:
        """Take a worktree out of its task's way without losing what it holds: for a run
        that was never ours (its beads claim was lost, or never answered, while it ran).

        Anything left in it is committed; a branch holding commits of its own is renamed to
        ``keep_as`` (never merged, never deleted: a human decides), and one holding nothing
        is deleted. The worktree itself goes, so the task can start afresh on its own
        branch. Returns the kept branch, or None when there was nothing to keep."""
        kept: str | None = None
        if (worktree.path / ".git").exists():
            try:
                await self.record(worktree.path, message)
            except GitError as exc:
                # It could not be recorded: the worktree and its branch stay as they are.
                log.warning("setting aside %s: %s", worktree.path, exc.message)
                return worktree.branch
        ref = f"refs/heads/{worktree.branch}"
        ahead = await git(self.root, "merge-base", "--is-ancestor", ref, worktree.base, check=False)
        if ahead.code != 0:  # commits its base lacks; or no base known to compare: kept
            kept = keep_as
        await git(self.root, "worktree", "remove", "--force", "--", str(worktree.path), check=False)
        if kept is not None:
            # Copied, then deleted, never ``git branch -m``: two renames at once share one
            # temporary reflog file (.git/logs/refs/.tmp-renamed-log) and one of them fails,
            # which two runs set aside together (their claims answered in one bd call) hit.
            copied = await git(self.root, "branch", "--no-track", "--", kept, ref, check=False)
            if copied.code != 0:
                log.warning("keeping %s as %s: %s", worktree.branch, kept, copied.err.strip())
                return worktree.branch
        await git(self.root, "branch", "-D", "--", worktree.branch, check=False)
        return kept

    async def discard(self, worktree: Worktree) -> bool:
        """Remove a worktree made for a task that never ran, and its branch, but only while
        the branch is still at its base: a commit on it is never thrown away (False)."""
        tip = await branch_tip(self.root, worktree.branch)
        if tip is not None and tip != worktree.base:
            return False
        if (worktree.path / ".git").exists() and await self.is_dirty(worktree.path):
            return False
        await git(self.root, "worktree", "remove", "--force", "--", str(worktree.path), check=False)
        await git(self.root, "branch", "-D", "--", worktree.branch, check=False)
        return True
