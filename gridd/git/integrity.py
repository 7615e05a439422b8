"""What must hold before gridd commits a run's work or lands a merge: git's own word on it.

- **Our own worktree.** A task's worktree is a linked worktree of the workspace's repository
  whose git directory points back at it (``git rev-parse --git-dir --show-toplevel``). An
  agent that repointed its ``.git`` file (at the main repository, say) would otherwise have
  gridd commit into someone else's checkout: ``own_worktree`` refuses (``worktree_foreign``).
- **No conflict left.** Unmerged index entries (``git ls-files -u``: a merge in progress,
  not concluded) and leftover conflict-marker lines added since a base (what ``git diff
  --check`` reports as ``leftover conflict marker``; its whitespace complaints are not ours
  to judge). ``leftover`` looks at a worktree against the task's base and, while a merge is
  in progress, against the commit being merged (new files included: they are marked
  intent-to-add first, as the commit would add them); ``markers_between`` at two commits (the
  merge queue's result against the feature branch's tip).

Paths a user allows (``[merge] allow_markers`` globs, or a reviewer's ``--accept-markers``)
are left out: a test fixture or a page about git may hold such lines on purpose. Only lines
*added* are reported, so a marker-like line already on the base is never held against a task.
"""

from __future__ import annotations

import asyncio
import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gridd.errors import GriddError
from gridd.git.worktrees import WorktreeGone, git

_MARKER = re.compile(r"^(?P<path>.+):(?P<line>\d+): leftover conflict marker$")
#: Paths as they are (no octal escapes), so they match the allowance globs and the files.
_RAW_PATHS = ("-c", "core.quotepath=off")
#: ``git diff --check``: 0 nothing found, 2 problems found; anything else is a real failure.
_CHECK_OK = (0, 2)
#: Paths per ``git add -N`` call (argv stays far below the kernel's limit).
_PATHS_PER_CALL = 500
#: Lines of text quoted per marker in feedback (the rest is counted).
TEXT_LIMIT = 200


class ForeignWorktree(GriddError):
    """The directory a run worked in is no longer the worktree gridd made for it."""

    code = "worktree_foreign"
    transient = False


@dataclass(frozen=True, order=True)
class MarkerLine:
    path: str
    line: int
    text: str = ""

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}"
        return f"{where}: {self.text}" if self.text else where


@dataclass(frozen=True)
class Leftover:
    """What is left of a conflict in a worktree: empty (falsy) when nothing is."""

    unmerged: list[str] = field(default_factory=list)
    markers: list[MarkerLine] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.unmerged or self.markers)

    @property
    def files(self) -> list[str]:
        return sorted({*self.unmerged, *(m.path for m in self.markers)})

    @property
    def lines(self) -> list[str]:
        return [str(m) for m in self.markers]

    def describe(self) -> str:
        """One sentence for an error, a question or an event."""
        parts = []
        if self.unmerged:
            parts.append(f"unmerged (not resolved and added): {', '.join(self.unmerged)}")
        if self.markers:
            at = ", ".join(f"{m.path}:{m.line}" for m in self.markers[:20])
            more = f" and {len(self.markers) - 20} more" if len(self.markers) > 20 else ""
            parts.append(f"conflict markers left at {at}{more}")
        return "; ".join(parts)


# -- the decisions (pure) --------------------------------------------------------------------


def parse_check(output: str) -> list[MarkerLine]:
    """The ``leftover conflict marker`` lines of ``git diff --check`` output (whitespace
    errors left out), each place once, in order."""
    found = set()
    for line in output.splitlines():
        match = _MARKER.match(line)
        if match:
            found.add(MarkerLine(match["path"], int(match["line"])))
    return sorted(found)


def parse_unmerged(output: str) -> list[str]:
    """The paths of ``git ls-files -u`` output (``mode sha stage<TAB>path``), each once."""
    return sorted({line.split("\t", 1)[1] for line in output.splitlines() if "\t" in line})


def allowed(path: str, patterns: Iterable[str]) -> bool:
    """``path`` matches one of the glob ``patterns`` (fnmatch: ``*`` also crosses ``/``)."""
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def not_allowed(markers: Iterable[MarkerLine], patterns: Iterable[str]) -> list[MarkerLine]:
    kept = list(patterns)
    return [m for m in markers if not allowed(m.path, kept)]


# -- git's word on it ---------------------------------------------------------------------------


async def _common_dir(root: Path) -> Path:
    """The repository's git directory: ``root/.git`` in a plain checkout (no git call)."""
    if (root / ".git").is_dir():
        return (root / ".git").resolve()
    res = await git(root, "rev-parse", "--path-format=absolute", "--git-common-dir")
    return Path(res.out.strip()).resolve()


def _gitfile_target(path: Path) -> Path | None:
    """The git directory the worktree's ``.git`` file names (None: no such file). gridd's
    own git calls there never follow it (``worktrees.pinned_git_dir``), so git's answer above
    is the worktree gridd made; a ``.git`` naming anything else says the run rewrote it."""
    try:
        text = (path / ".git").read_text(errors="replace")
    except OSError:  # gone, or a directory
        return None
    if not text.startswith("gitdir: "):
        return None
    return (path / text[len("gitdir: ") :].strip()).resolve()


async def own_worktree(root: Path, path: Path) -> Path:
    """Refuse (``ForeignWorktree``) unless ``path`` is still a linked worktree of ``root``'s
    repository, with a git directory of its own that names ``path`` as its worktree.
    Returns that git directory."""
    if not path.is_dir():
        raise WorktreeGone(
            f"the worktree {path} is gone: nothing left in it can be recorded",
            details={"path": str(path)},
        )
    res = await git(
        path,
        "rev-parse",
        "--path-format=absolute",
        "--git-dir",
        "--git-common-dir",
        "--show-toplevel",
        check=False,
    )
    expected_common = await _common_dir(root)
    problem = ""
    lines = res.out.split("\n")
    if res.code != 0 or len(lines) < 3:
        problem = f"git does not see a worktree there ({res.err.strip()[:200]})"
    else:
        git_dir, common_dir, top = (Path(x).resolve() for x in lines[:3])
        if top != path.resolve():
            problem = f"its top level is {top}"
        elif common_dir != expected_common:
            problem = f"it belongs to another repository ({common_dir})"
        elif git_dir == common_dir or git_dir.parent != common_dir / "worktrees":
            problem = f"its git directory is {git_dir}, not a linked worktree's"
        else:
            try:
                back = Path((git_dir / "gitdir").read_text().strip()).resolve()
            except OSError:
                back = None
            named = _gitfile_target(path)
            if back != (path / ".git").resolve():
                problem = f"its git directory {git_dir} belongs to another worktree ({back})"
            elif named != git_dir:
                problem = f"its .git names {named or 'no git directory'}, not {git_dir}"
            else:
                return git_dir
    raise ForeignWorktree(
        f"{path} is no longer the worktree gridd made: {problem}; nothing was committed there",
        details={"path": str(path), "problem": problem},
    )


def merge_head(git_dir: Path) -> str:
    """The commit a merge in progress in that worktree merges (``MERGE_HEAD``), or ""."""
    try:
        return (git_dir / "MERGE_HEAD").read_text().split()[0]
    except (OSError, IndexError):
        return ""


async def _check(cwd: Path, *revs: str, timeout: float | None = None) -> list[MarkerLine]:
    res = await git(cwd, *_RAW_PATHS, "diff", "--check", *revs, "--", check=False, timeout=timeout)
    if res.code not in _CHECK_OK:
        raise GriddError(
            f"git diff --check {' '.join(revs)} failed: {res.err.strip()[:500]}",
            code="git_failed",
            details={"exitCode": res.code},
        )
    return parse_check(res.out)


async def leftover(
    path: Path, *, base: str, git_dir: Path | None, allow: Iterable[str] = ()
) -> Leftover:
    """What is left of a conflict in the worktree at ``path`` (committed or not): unmerged
    entries, and marker lines added since ``base`` or since the commit being merged."""
    merging = merge_head(git_dir) if git_dir is not None else ""
    revs = [base, merging] if merging and merging != base else [base]
    unmerged, untracked = await asyncio.gather(
        git(path, *_RAW_PATHS, "ls-files", "-u"),
        git(path, "ls-files", "-z", "--others", "--exclude-standard"),
    )
    await _intend_to_add([p for p in untracked.out.split("\0") if p], path)
    checks = await asyncio.gather(*(_check(path, rev) for rev in revs))
    markers = not_allowed({m for found in checks for m in found}, allow)
    return Leftover(
        unmerged=parse_unmerged(unmerged.out), markers=_with_text(path, sorted(markers))
    )


async def _intend_to_add(paths: list[str], cwd: Path) -> None:
    """New files, made visible to ``git diff`` (``add -N``: no content staged, nothing
    else in the index touched, unmerged entries above all); the commit adds them anyway."""
    for start in range(0, len(paths), _PATHS_PER_CALL):
        chunk = paths[start : start + _PATHS_PER_CALL]
        await git(cwd, "--literal-pathspecs", "add", "-N", "--", *chunk)


async def markers_between(
    cwd: Path, old: str, new: str, *, allow: Iterable[str] = (), timeout: float | None = None
) -> list[str]:
    """The files holding marker lines that ``new`` adds over ``old`` (not allowed ones)."""
    found = not_allowed(await _check(cwd, old, new, timeout=timeout), allow)
    return sorted({m.path for m in found})


def _with_text(root: Path, markers: list[MarkerLine]) -> list[MarkerLine]:
    """The lines themselves, read from the worktree, for the feedback that names them."""
    out = []
    texts: dict[str, list[str]] = {}
    for m in markers:
        if m.path not in texts:
            try:
                texts[m.path] = (root / m.path).read_text(errors="replace").splitlines()
            except OSError:
                texts[m.path] = []
        lines = texts[m.path]
        text = lines[m.line - 1][:TEXT_LIMIT] if 0 < m.line <= len(lines) else ""
        out.append(MarkerLine(m.path, m.line, text))
    return out
