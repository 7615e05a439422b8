"""Landing a merge: the feature branch moves only while no working tree has it checked out.

``git update-ref`` refuses nothing of the kind (and ``git branch -f`` checks before it
updates, not with it), so the queue holds the refusal itself, across the update:

1. For every worktree of the repository that is not gridd's own (the user's checkout, and
   any linked worktree outside ``.grid/``) it creates that worktree's ``index.lock`` and
   ``HEAD.lock``, with ``O_EXCL`` as git does. While they are held, a ``git checkout`` (or
   commit, rebase, switch) there fails at once or waits (git retries a HEAD lock for
   ``core.filesRefLockTimeout``, 100 ms by default): nothing can point a HEAD at the branch.
   A lock that is already there means a git runs in that worktree now: the landing waits.
2. With the locks held, each worktree's HEAD is read (and the branch of a rebase or a
   bisect in progress). A user worktree whose index was written within ``QUIET_SECONDS``
   counts as busy too: ``git checkout`` writes the index, lets go of ``index.lock``, and
   only then takes ``HEAD.lock`` to point HEAD at the branch.
3. ``git update-ref refs/heads/F new old``: compare-and-swap against the tip merged onto.
4. The worktrees are listed again: one added meanwhile (a ``git worktree add`` of F) that
   has F checked out gets the swap undone, by compare-and-swap again.
5. The locks go (a landing holds them for about one ``git update-ref``).

gridd's own worktrees (the tasks', the integration one) are checked, never locked: an
agent's git must not fail because a merge lands. A lock this module leaves behind (a daemon
killed mid-landing) names its pid, and is removed by the next landing once that pid is gone.
Only the files ref backend is understood (a reftable repository keeps HEAD elsewhere).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from gridd.git.worktrees import GitTimeout, git

#: An index written this recently may belong to a checkout that has yet to move HEAD.
QUIET_SECONDS = 0.5
#: A lock of ours older than this is stale whatever its pid says (a landing takes ms).
STALE_SECONDS = 600.0
_MARK = b"gridd landing pid="


@dataclass(frozen=True)
class Landed:
    """The branch moved to the merge."""


@dataclass(frozen=True)
class Moved:
    """The branch is no longer at the tip merged onto: merge again."""


@dataclass(frozen=True)
class Held:
    """Not now: the branch is checked out in ``worktree`` (``checked_out``), or a git runs
    there (``busy``)."""

    worktree: str
    reason: str
    message: str


@dataclass(frozen=True)
class Tree:
    path: str  # the working tree, for messages
    gitdir: Path  # its own git directory: HEAD, index
    ours: bool  # made by gridd: checked, not locked


def worktrees_of(common: Path, own: tuple[Path, ...]) -> list[Tree]:
    """Every worktree of the repository whose common git directory is ``common``, read
    from ``common`` itself (no ``git worktree list``: this runs under the locks)."""
    main = common.parent if common.name == ".git" else common
    trees = [Tree(str(main), common, _under(main, own))]
    try:
        entries = sorted((common / "worktrees").iterdir())
    except OSError:
        entries = []
    for gitdir in entries:
        try:
            dotgit = Path((gitdir / "gitdir").read_text().strip())
        except OSError:
            continue  # being added or pruned right now
        path = dotgit.parent
        trees.append(Tree(str(path), gitdir, _under(path, own)))
    return trees


def _under(path: Path, own: tuple[Path, ...]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real == o or o in real.parents for o in own)


def holds(gitdir: Path, branch: str) -> bool:
    """Does the worktree with this git directory have ``branch`` checked out (HEAD on it,
    or a rebase or bisect of it in progress)?"""
    ref = f"refs/heads/{branch}"
    if _read(gitdir / "HEAD") == f"ref: {ref}":
        return True
    if ref in (
        _read(gitdir / "rebase-merge" / "head-name"),
        _read(gitdir / "rebase-apply" / "head-name"),
    ):
        return True
    return _read(gitdir / "BISECT_START") in (branch, ref)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _recently_written(path: Path, now: float) -> bool:
    try:
        return now - path.stat().st_mtime < QUIET_SECONDS
    except OSError:
        return False


class _Locks:
    """git's own lock files, created as git creates them, naming this process."""

    def __init__(self) -> None:
        self.taken: list[Path] = []

    def take(self, path: Path) -> bool:
        """True: now ours (or its worktree is gone); False: someone else holds it."""
        for _ in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if not _stale(path):
                    return False
                path.unlink(missing_ok=True)
                continue
            except FileNotFoundError:
                return True  # the worktree went away: nothing to hold there
            with os.fdopen(fd, "wb") as fh:
                fh.write(_MARK + str(os.getpid()).encode() + b"\n")
            self.taken.append(path)
            return True
        return False

    def release(self) -> None:
        for path in reversed(self.taken):
            path.unlink(missing_ok=True)
        self.taken.clear()


def _stale(path: Path) -> bool:
    """A lock left by a landing whose daemon is gone."""
    try:
        text = path.read_bytes()[:64]
        age = time.time() - path.stat().st_mtime
    except OSError:
        return False
    if not text.startswith(_MARK):
        return False  # git's own: a git runs there
    try:
        pid = int(text[len(_MARK) :].split(b"\n")[0])
    except ValueError:
        return True
    if pid == os.getpid() or age > STALE_SECONDS:
        return True  # a landing releases its locks before the next one starts
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Landing:
    def __init__(self, root: Path, *, own: tuple[Path, ...], git_timeout: float) -> None:
        self.root = root
        self.own = tuple(Path(os.path.realpath(p)) for p in own)
        self.timeout = git_timeout
        self._common: Path | None = None

    async def common_dir(self) -> Path:
        if self._common is None:
            res = await git(self.root, "rev-parse", "--git-common-dir", timeout=self.timeout)
            self._common = Path(os.path.realpath(self.root / res.out.strip()))
        return self._common

    async def sweep(self) -> list[Path]:
        """Remove the locks a landing of a daemon now gone left in the user's worktrees (it
        was killed mid-landing): their git would refuse to run until a merge lands again."""
        removed = []
        for tree in worktrees_of(await self.common_dir(), self.own):
            for name in ("index.lock", "HEAD.lock"):
                lock = tree.gitdir / name
                if not tree.ours and lock.exists() and _stale(lock):
                    lock.unlink(missing_ok=True)
                    removed.append(lock)
        return removed

    async def looks_clear(self, branch: str) -> bool:
        """Without taking a lock: could a landing on ``branch`` go ahead now? (What a
        waiting merge asks before trying again, so that it does not take a user's locks
        every tenth of a second while they have the branch checked out.)"""
        trees = worktrees_of(await self.common_dir(), self.own)
        now = time.time()
        for tree in trees:
            if holds(tree.gitdir, branch):
                return False
            if not tree.ours and (
                (tree.gitdir / "index.lock").exists()
                or _recently_written(tree.gitdir / "index", now)
            ):
                return False
        return True

    async def land(self, branch: str, *, new: str, old: str) -> Landed | Moved | Held:
        """Move ``branch`` from ``old`` to ``new`` unless a working tree has it checked out."""
        common = await self.common_dir()
        ref = f"refs/heads/{branch}"
        trees = worktrees_of(common, self.own)
        locks = _Locks()
        try:
            for tree in trees:
                if tree.ours:
                    continue
                for name in ("index.lock", "HEAD.lock"):
                    if not locks.take(tree.gitdir / name):
                        return Held(
                            tree.path, "busy", f"a git command runs in {tree.path} ({name})"
                        )
            for tree in trees:
                if holds(tree.gitdir, branch):
                    return Held(
                        tree.path, "checked_out", f"{branch!r} is checked out in {tree.path}"
                    )
            now = time.time()
            for tree in trees:
                if not tree.ours and _recently_written(tree.gitdir / "index", now):
                    return Held(tree.path, "busy", f"{tree.path}'s index was just written")
            if not await self._swap(ref, new, old):
                return Moved()
            known = {tree.gitdir for tree in trees}
            for tree in worktrees_of(common, self.own):
                if tree.gitdir not in known and holds(tree.gitdir, branch):
                    # Added during the swap (``git worktree add`` of the branch): undone.
                    await self._swap(ref, old, new)
                    return Held(
                        tree.path, "checked_out", f"{branch!r} is checked out in {tree.path}"
                    )
            return Landed()
        finally:
            locks.release()

    async def _swap(self, ref: str, new: str, old: str) -> bool:
        try:
            res = await git(
                self.root, "update-ref", ref, new, old, check=False, timeout=self.timeout
            )
        except GitTimeout:
            # A reference-transaction hook that hangs: the ref may have moved before it did.
            now = await git(
                self.root,
                "rev-parse",
                "--verify",
                "--quiet",
                ref,
                check=False,
                timeout=self.timeout,
            )
            if now.out.strip() == new:
                return True
            raise
        return res.code == 0
