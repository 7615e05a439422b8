"""Setting a run's worktree aside (a run whose beads claim was lost while it ran): its work is
kept on a branch of its own, even when several runs are set aside at once, and a worktree
holding nothing of its own leaves nothing behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gridd.git.worktrees import Worktree, Worktrees
from tests.support.git import git


def branches(root: Path) -> set[str]:
    return set(git(root, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split())


async def made(worktrees: Worktrees, ids: list[str], *, work: bool) -> list[Worktree]:
    trees = [await worktrees.create(task_id, None) for task_id in ids]
    if work:
        for tree in trees:
            (tree.path / "out.txt").write_text(f"work of {tree.task_id}\n")
    return trees


def test_runs_set_aside_at_once_each_keep_their_work_on_their_own_branch(repo: Path) -> None:
    worktrees = Worktrees(repo, repo / ".grid" / "worktrees")
    ids = [f"t{i}" for i in range(8)]

    async def set_aside_together() -> list[str | None]:
        trees = await made(worktrees, ids, work=True)
        return list(
            await asyncio.gather(
                *(worktrees.set_aside(t, f"grid-kept/{t.task_id}-a1", "kept") for t in trees)
            )
        )

    for round_ in range(3):  # git's own rename races one time in ten or so: give it chances
        kept = asyncio.run(set_aside_together())
        assert kept == [f"grid-kept/{t}-a1" for t in ids], f"round {round_}"
        assert not {f"grid/{t}" for t in ids} & branches(repo)
        for task_id in ids:
            assert not (repo / ".grid" / "worktrees" / task_id).exists()
            shown = git(repo, "show", f"grid-kept/{task_id}-a1:out.txt")
            assert shown == f"work of {task_id}\n"
            git(repo, "branch", "-D", f"grid-kept/{task_id}-a1")  # the next round keeps anew


def test_a_run_that_left_nothing_is_set_aside_without_a_kept_branch(repo: Path) -> None:
    worktrees = Worktrees(repo, repo / ".grid" / "worktrees")
    before = branches(repo)

    async def set_aside() -> str | None:
        (tree,) = await made(worktrees, ["t1"], work=False)
        return await worktrees.set_aside(tree, "grid-kept/t1-a1", "kept")

    assert asyncio.run(set_aside()) is None
    assert branches(repo) == before
    assert not (repo / ".grid" / "worktrees" / "t1").exists()


def test_a_run_whose_base_is_unknown_keeps_its_work_rather_than_guess(repo: Path) -> None:
    # A run re-checked after a restart may no longer know the commit its branch started
    # from: what it committed is kept, never deleted on a comparison git could not make.
    worktrees = Worktrees(repo, repo / ".grid" / "worktrees")

    async def set_aside() -> str | None:
        (tree,) = await made(worktrees, ["t1"], work=True)
        unknown = Worktree(tree.task_id, tree.path, tree.branch, "")
        return await worktrees.set_aside(unknown, "grid-kept/t1-a1", "kept")

    assert asyncio.run(set_aside()) == "grid-kept/t1-a1"
    assert git(repo, "show", "grid-kept/t1-a1:out.txt") == "work of t1\n"
    assert "grid/t1" not in branches(repo)
