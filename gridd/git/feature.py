"""The session's feature branch: validated, refused while checked out, created once.

A session names the branch every approved task is merged into. It is created at session
start, before any task spawns, from the base branch (by default the branch checked out in
the main worktree), with a compare-and-swap ``update-ref`` so two starts racing create it
once. A branch that already exists is continued from its tip. A branch checked out in any
worktree (the user's own included) is refused: gridd never moves a ref under a working tree.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from gridd.errors import Conflict, ValidationFailed
from gridd.git.worktrees import branch_tip, git
from gridd.ids import branch_problem

#: ``git worktree list`` that failed (a worktree being added beside it) is asked again
#: after these pauses; the last try's error is the answer.
LIST_RETRY_PAUSES = (0.05, 0.1, 0.2)


@dataclass(frozen=True)
class FeatureBranch:
    name: str
    base_branch: str | None  # None: the main worktree's HEAD was detached
    base_commit: str
    tip: str
    created: bool


def checked_out_branches(porcelain: str) -> dict[str, str]:
    """``git worktree list --porcelain`` -> {branch name: worktree path} (PURE)."""
    found: dict[str, str] = {}
    path = ""
    for line in porcelain.splitlines():
        if line.startswith("worktree "):
            path = line[len("worktree ") :]
        elif line.startswith("branch refs/heads/"):
            found[line[len("branch refs/heads/") :]] = path
    return found


async def checked_out_at(root: Path, branch: str) -> str | None:
    """The worktree that has ``branch`` checked out, or None.

    A worktree being added at the same moment (one prepared ahead, another task's start)
    can make git read its half-written entry and fail: the listing is asked again."""
    for pause in LIST_RETRY_PAUSES:
        res = await git(root, "worktree", "list", "--porcelain", check=False)
        if res.code == 0:
            break
        await asyncio.sleep(pause)
    else:
        res = await git(root, "worktree", "list", "--porcelain")
    return checked_out_branches(res.out).get(branch)


async def validate_branch_name(root: Path, name: str, *, what: str = "featureBranch") -> None:
    """422 unless ``git check-ref-format --branch`` accepts ``name`` (and our own rules)."""
    problem = branch_problem(name)
    if problem is None:
        res = await git(root, "check-ref-format", "--branch", name, check=False)
        if res.code != 0:
            problem = res.err.strip().removeprefix("fatal: ") or "git refuses it"
    if problem is not None:
        raise ValidationFailed(
            f"invalid branch name {name[:200]!r}: {problem}",
            code="invalid_branch",
            details={"field": what, "branch": name[:200], "problem": problem},
        )


async def prepare(root: Path, name: str, base_branch: str | None) -> FeatureBranch:
    """Validate ``name`` and create it from the base when missing (exactly once)."""
    await validate_branch_name(root, name)
    if base_branch is not None:
        await validate_branch_name(root, base_branch, what="baseBranch")
    holder = await checked_out_at(root, name)
    if holder is not None:
        raise Conflict(
            f"branch {name!r} is checked out in {holder}; gridd never moves a branch under"
            " a working tree. Check out another branch there, or choose another featureBranch",
            code="branch_checked_out",
            details={"branch": name, "worktree": holder},
        )
    if base_branch is None:
        res = await git(root, "symbolic-ref", "-q", "--short", "HEAD", check=False)
        base_branch = res.out.strip() or None
    if base_branch is not None:
        base_commit = await branch_tip(root, base_branch)
        if base_commit is None:
            raise ValidationFailed(
                f"base branch {base_branch!r} does not exist",
                code="unknown_base_branch",
                details={"baseBranch": base_branch},
            )
    else:
        base_commit = (await git(root, "rev-parse", "--verify", "HEAD^{commit}")).out.strip()
    tip = await branch_tip(root, name)
    if tip is not None:
        return FeatureBranch(name, base_branch, base_commit, tip, created=False)
    # The empty old value makes this a create-only update: of two racing starts, one wins.
    res = await git(root, "update-ref", f"refs/heads/{name}", base_commit, "", check=False)
    tip = await branch_tip(root, name)
    if tip is None:
        raise ValidationFailed(
            f"could not create branch {name!r}: {res.err.strip()}",
            code="invalid_branch",
            details={"branch": name},
        )
    return FeatureBranch(name, base_branch, base_commit, tip, created=res.code == 0)
