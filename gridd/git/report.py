"""What the feature branch holds against its base (``POST /session/finish``).

Read-only: gridd never merges the feature branch into its base and never pushes. The report
says what the user would merge (commits, files, which tasks landed and which did not) and
how to take it from there.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gridd.errors import Conflict
from gridd.git.diff import DiffFile, parse_diff
from gridd.git.worktrees import branch_tip, git
from gridd.model import SessionState, Task, TaskStatus, WireModel

MAX_COMMITS = 500


class CommitLine(WireModel):
    sha: str
    subject: str


class UnmergedTask(WireModel):
    id: str
    status: str


class FeatureReport(WireModel):
    feature_branch: str
    base_branch: str | None
    base: str  # where the feature branch forked from its base (merge-base)
    head: str
    commits: list[CommitLine] = Field(default_factory=list)  # newest first
    commit_count: int = 0
    files: list[DiffFile] = Field(default_factory=list)
    merged_tasks: list[str] = Field(default_factory=list)
    unmerged_tasks: list[UnmergedTask] = Field(default_factory=list)
    next_steps: list[str] = Field(default_factory=list)


def next_steps(feature: str, base: str | None) -> list[str]:
    target = base or "<your base branch>"
    return [
        f"git log --oneline --graph {target}..{feature}",
        f"git switch {target} && git merge --no-ff {feature}",
        f"git push -u origin {feature}   # then open a pull request",
    ]


async def _merged_into(root: Path, task: Task, feature: str, head: str) -> bool:
    """Whether ``task`` was merged into ``feature``: as it records (``merged_into``), or, for
    a task merged before gridd recorded the branch, whether its merge commit is in it."""
    if task.status != TaskStatus.DONE or not task.merge_commit:
        return False
    if task.merged_into is not None:
        return task.merged_into == feature
    found = await git(root, "merge-base", "--is-ancestor", task.merge_commit, head, check=False)
    return found.code == 0


async def feature_report(root: Path, session: SessionState, tasks: list[Task]) -> FeatureReport:
    feature = session.feature_branch
    if feature is None:
        raise Conflict("this session has no feature branch", code="no_feature_branch")
    head = await branch_tip(root, feature)
    if head is None:
        raise Conflict(f"feature branch {feature!r} is gone", code="feature_missing")
    base_ref = session.base_branch and await branch_tip(root, session.base_branch)
    base = session.base_commit or head
    if base_ref:
        fork = await git(root, "merge-base", base_ref, head, check=False)
        base = fork.out.strip() or base
    log = await git(root, "log", "--format=%H%x09%s", f"-{MAX_COMMITS}", f"{base}..{head}", "--")
    commits = [
        CommitLine(sha=sha, subject=subject)
        for sha, _, subject in (line.partition("\t") for line in log.out.splitlines() if line)
    ]
    count = await git(root, "rev-list", "--count", f"{base}..{head}", "--")
    status = await git(root, "diff", "-z", "-M", "--name-status", base, head, "--")
    numstat = await git(root, "diff", "-z", "-M", "--numstat", base, head, "--")
    merged = sorted([t.id for t in tasks if await _merged_into(root, t, feature, head)])
    unmerged = [
        UnmergedTask(id=t.id, status=t.status.value)
        for t in sorted(tasks, key=lambda t: t.id)
        if t.status not in (TaskStatus.DONE, TaskStatus.CANCELLED)
    ]
    return FeatureReport(
        feature_branch=feature,
        base_branch=session.base_branch,
        base=base,
        head=head,
        commits=commits,
        commit_count=int(count.out.strip() or 0),
        files=parse_diff(status.out, numstat.out),
        merged_tasks=merged,
        unmerged_tasks=unmerged,
        next_steps=next_steps(feature, session.base_branch),
    )
