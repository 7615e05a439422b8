"""What happens to a task whose merge conflicted or failed its check, and after a merge.

The feature branch is untouched by then (the queue aborted in its integration worktree);
the task's commits are never touched at all. The session's ``on_conflict`` policy decides:

- ``agent``: the feature branch is merged into the task's own worktree, conflicts left in
  place, and the task's agent runs again with a prompt naming the conflicted files (or the
  check's output). When it finishes, the task is back in review.
- ``human``: the task waits in review with the conflict on it, and a question is asked
  (answers: ``merge again``, ``agent``, ``fail``).
- ``fail``: the task fails, its branch kept.

After a merge, the task's worktree and branch go in ``teardown.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gridd.adapters.base import Ask
from gridd.events import EventBus
from gridd.git.integrity import markers_between
from gridd.git.worktrees import GitError, Worktrees, branch_tip, git
from gridd.lifecycle import move_task
from gridd.model import Agent, Question, Task, TaskStatus, utcnow
from gridd.questions import QuestionBook
from gridd.settings import MergeSettings
from gridd.state import GridState

log = logging.getLogger(__name__)

#: Answers to the question a ``human`` policy asks.
ANSWERS = ["merge again", "agent", "fail"]
OUTPUT_TAIL = 4000


def merge_asker(task_id: str) -> str:
    """The pseudo agent id the merge queue asks its questions as."""
    return f"merge:{task_id}"


def conflict_feedback(feature: str, files: list[str]) -> str:
    listed = "\n".join(f"- {f}" for f in files)
    return (
        f"Merging this task into the feature branch {feature!r} conflicted. The feature branch"
        " has been merged into your worktree and the conflicts are left in these files:\n"
        f"{listed}\n\nResolve every conflict (remove the <<<<<<< ======= >>>>>>> markers,"
        " keeping both sides' intent), make sure the result works, and commit."
    )


def check_feedback(feature: str, output: str) -> str:
    return (
        f"Merged into the feature branch {feature!r}, this task's work failed the merge check."
        " The feature branch has been merged into your worktree. Fix the problem and commit."
        f" The check's output ended with:\n\n{output[-OUTPUT_TAIL:]}"
    )


def ask_human(
    questions: QuestionBook,
    task: Task,
    *,
    key: str,
    kind: str,
    text: str,
    options: list[str],
    meta: dict[str, object] | None = None,
) -> None:
    """Ask a human about ``task`` as the merge queue (``merge_asker``): the answer comes back
    through the composition root's merge answers, not to an agent."""
    asker = Agent(
        id=merge_asker(task.id), task_id=task.id, profile="merge", worktree_path=task.worktree or ""
    )
    questions.ask(
        asker,
        Ask(
            key=f"{key}-{task.id}-{utcnow().timestamp():.0f}",
            type=kind,
            question=text,
            options=list(options),
            meta=meta or {},
        ),
    )


class ConflictPolicy:
    def __init__(
        self,
        *,
        settings: MergeSettings,
        state: GridState,
        bus: EventBus,
        worktrees: Worktrees,
        questions: QuestionBook,
    ) -> None:
        self.settings = settings
        self.state = state
        self.bus = bus
        self.worktrees = worktrees
        self.questions = questions

    async def conflict(self, task: Task, *, files: list[str], feature_commit: str) -> None:
        self.bus.publish(
            "task.merge_conflict",
            {"taskId": task.id, "files": files, "featureCommit": feature_commit},
        )
        feature = self.state.session.feature_branch or ""
        await self._apply(
            task,
            files=files,
            feature_commit=feature_commit,
            error=f"merge conflict in {', '.join(files)}",
            feedback=conflict_feedback(feature, files),
        )

    async def check_failed(self, task: Task, *, output: str, feature_commit: str) -> None:
        tail = output[-OUTPUT_TAIL:]
        self.bus.publish(
            "task.merge_check_failed",
            {"taskId": task.id, "output": tail, "featureCommit": feature_commit},
        )
        feature = self.state.session.feature_branch or ""
        await self._apply(
            task,
            files=[],
            feature_commit=feature_commit,
            error="the merge check failed",
            feedback=check_feedback(feature, tail),
        )

    async def marker_files(
        self, task: Task, *, cwd: Path, tip: str, merged: str, timeout: float | None = None
    ) -> list[str]:
        """The files a merge's result adds conflict-marker lines to, but for the paths the
        config allows (``allow_markers``) and the task's approve accepted."""
        allow = [*self.settings.allow_markers, *task.accepted_markers]
        return await markers_between(cwd, tip, merged, allow=allow, timeout=timeout)

    def refuse_markers(self, task: Task, *, files: list[str], feature_commit: str) -> None:
        """Refuse the merge, whatever the policy: back to review, naming the files."""
        self.bus.publish(
            "task.merge_refused",
            {
                "taskId": task.id,
                "reason": "conflict_markers",
                "files": files,
                "featureCommit": feature_commit,
            },
        )
        error = f"the merge would add conflict markers to {', '.join(files)}"
        move_task(
            self.state,
            task.id,
            TaskStatus.REVIEW,
            reason=f"merge refused: {error}",
            error=f"{error}; fix them (reject) or accept them (approve --accept-markers PATH)",
            conflict_unresolved=files,
            merge_commit=None,
            merge_queued_at=None,
        )
        self.state.flush()

    async def _apply(
        self, task: Task, *, files: list[str], feature_commit: str, error: str, feedback: str
    ) -> None:
        policy = self.state.session.on_conflict
        if policy == "fail":
            move_task(
                self.state,
                task.id,
                TaskStatus.FAILED,
                reason=error,
                error=error,
                merge_conflict=files,
                merge_commit=None,
            )
        elif policy == "human":
            move_task(
                self.state,
                task.id,
                TaskStatus.REVIEW,
                reason=f"{error}; a human decides",
                error=error,
                merge_conflict=files,
                merge_commit=None,
                merge_queued_at=None,
            )
            self._ask(task, error)
        else:
            await self.to_agent(
                task, feature_commit=feature_commit, files=files, error=error, feedback=feedback
            )
        self.state.flush()

    async def to_agent(
        self, task: Task, *, feature_commit: str, files: list[str], error: str, feedback: str
    ) -> None:
        """Merge the feature branch into the task's worktree (conflicts left in place) and
        send the task back to its agent."""
        worktree = await self.worktrees.create(task.id, None, known_base=task.base_commit)
        path = worktree.path
        await self.worktrees.commit_all(
            path,
            f"gridd: {task.id}: work before merging the feature",
            timeout=self.settings.git_timeout_seconds,
        )
        identity = await self.worktrees.identity()
        feature = self.state.session.feature_branch or feature_commit
        message = f"gridd: merge {feature} into task {task.id}"
        res = await git(
            path,
            *identity,
            "merge",
            "--no-ff",
            "--no-edit",
            "-m",
            message,
            feature_commit,
            check=False,
            timeout=self.settings.git_timeout_seconds,
        )
        left = await git(
            path,
            "diff",
            "--name-only",
            "--diff-filter=U",
            check=False,
            timeout=self.settings.git_timeout_seconds,
        )
        conflicted = sorted({f for f in left.out.splitlines() if f}) or files
        if res.code != 0 and not left.out.strip():
            log.warning("merging %s into %s's worktree failed: %s", feature, task.id, res.err)
        move_task(
            self.state,
            task.id,
            TaskStatus.WORKING,
            reason=f"{error}; back to its agent",
            feedback=feedback,
            attempts=0,  # a new round of work, as after a reviewer's reject
            sessions=0,
            summary=None,
            error=error,
            merge_conflict=conflicted if res.code != 0 else [],
            merge_commit=None,
            merge_queued_at=None,
            base_commit=feature_commit,  # its change is now reviewed against integrated work
            worktree=str(path),
            branch=worktree.branch,
        )
        self.bus.publish(
            "task.merge_returned",
            {"taskId": task.id, "files": conflicted, "featureCommit": feature_commit},
        )

    def _ask(self, task: Task, error: str) -> None:
        text = (
            f"Task {task.id} could not be merged: {error}. Fix it on its branch"
            f" ({task.branch}) and answer 'merge again', or send it to its agent ('agent'),"
            " or fail it ('fail')."
        )
        ask_human(
            self.questions, task, key="merge", kind="merge_conflict", text=text, options=ANSWERS
        )

    async def answered(self, question: Question, response: str) -> None:
        """A human's answer to a merge question."""
        task = self.state.tasks.get(question.task_id)
        if task is None or task.status != TaskStatus.REVIEW:
            return
        if response == "merge again":
            move_task(
                self.state,
                task.id,
                TaskStatus.MERGING,
                reason="merge again (a human)",
                merge_queued_at=utcnow(),
                error=None,
            )
            self.bus.publish("task.merge_queued", {"taskId": task.id})
        elif response == "fail":
            move_task(self.state, task.id, TaskStatus.FAILED, reason="failed by a human")
        else:
            feature = self.state.session.feature_branch
            tip = feature and await branch_tip(self.worktrees.root, feature)
            if not tip:
                raise GitError(f"the feature branch {feature} is gone", details={"branch": feature})
            await self.to_agent(
                task,
                feature_commit=tip,
                files=task.merge_conflict,
                error=task.error or "merge conflict",
                feedback=conflict_feedback(feature or "", task.merge_conflict),
            )
        self.state.flush()
