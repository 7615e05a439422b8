"""A run that ended with a conflict still in its worktree: back to its agent, or a human.

The finisher asks ``integrity.leftover`` before it commits a completed run. When git still
sees a conflict (unmerged entries, or marker lines the run added), nothing is committed:
the worktree keeps the merge exactly as the agent left it, and the task does not go to
review. The session's ``on_conflict`` policy decides what comes next:

- ``agent``, attempts left: ``working`` again, its feedback naming the files and the marker
  lines; the run counts toward ``maxAttempts``;
- ``human``, or ``agent`` with its attempts used up: ``blocked`` with ``conflictUnresolved``
  (the files), and a question: ``check again`` (a human fixed it in the worktree: checked
  again, then committed and sent to review when clean), ``review anyway`` (committed as it
  is and sent to review: the merge queue still refuses the markers unless the approve
  accepts them, ``--accept-markers``), or ``agent`` (a new round of attempts);
- ``fail``: ``failed``, the work left uncommitted in its worktree.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gridd.events import EventBus
from gridd.git.integrity import Leftover, leftover, own_worktree
from gridd.git.on_conflict import ask_human
from gridd.git.worktrees import Worktrees
from gridd.lifecycle import move_task
from gridd.model import Question, Task, TaskStatus
from gridd.questions import QuestionBook
from gridd.settings import MergeSettings
from gridd.state import GridState

log = logging.getLogger(__name__)

#: The type of the question asked when a human decides (its answers come back here).
UNRESOLVED_QUESTION = "conflict_unresolved"
#: Answers to the question asked when a human decides.
ANSWERS = ["check again", "review anyway", "agent"]
#: Marker lines quoted in an event or a feedback (the rest are counted).
LINES_SHOWN = 50


def unresolved_feedback(left: Leftover) -> str:
    parts = [
        "Your last run ended with the merge conflict still unresolved; nothing of it"
        " was committed, and it is all still in your worktree."
    ]
    if left.unmerged:
        listed = "\n".join(f"- {f}" for f in left.unmerged)
        parts.append(f"git still lists these files as unmerged:\n{listed}")
    if left.markers:
        shown = "\n".join(f"- {m}" for m in left.markers[:LINES_SHOWN])
        more = len(left.markers) - LINES_SHOWN
        extra = f"\n- ... and {more} more" if more > 0 else ""
        parts.append(f"Conflict markers are left at these lines:\n{shown}{extra}")
    parts.append(
        "Resolve every conflict: edit each file so that it keeps both sides' intent and holds"
        " no <<<<<<< ======= >>>>>>> lines, `git add` it, make sure the result works, and"
        " commit."
    )
    return "\n\n".join(parts)


class Unresolved:
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

    async def left_in(self, task: Task, path: Path, base: str) -> Leftover:
        """What git says is left of a conflict in ``path`` (after checking that it is still
        the worktree gridd made: ``ForeignWorktree`` otherwise)."""
        git_dir = await own_worktree(self.worktrees.root, path)
        return await leftover(path, base=base, git_dir=git_dir, allow=self.settings.allow_markers)

    def refuse(self, task: Task, left: Leftover, *, agent_id: str | None) -> None:
        """The run is not committed and not reviewed. No ``await``: the finisher calls this
        right after settling the run, as it gives any other outcome its status."""
        policy = self.state.session.on_conflict
        retry = policy == "agent" and task.attempts < task.max_attempts
        error = f"the merge conflict is not resolved: {left.describe()}"
        self._publish(task, left, agent_id=agent_id, will_retry=retry)
        if retry:
            # working, not ready: like the round that sent it to its agent, it needs no
            # session slot (the session may have ended while everything was in review).
            move_task(
                self.state,
                task.id,
                TaskStatus.WORKING,
                reason="conflict left unresolved; back to its agent",
                feedback=unresolved_feedback(left),
                sessions=0,
                summary=None,
                error=error,
                conflict_unresolved=left.files,
            )
        elif policy == "fail":
            move_task(
                self.state,
                task.id,
                TaskStatus.FAILED,
                reason="conflict left unresolved",
                error=error,
                conflict_unresolved=left.files,
            )
        else:
            move_task(
                self.state,
                task.id,
                TaskStatus.BLOCKED,
                reason="conflict left unresolved; a human decides",
                error=error,
                conflict_unresolved=left.files,
            )
            self._ask(task, left)

    def _publish(
        self, task: Task, left: Leftover, *, agent_id: str | None, will_retry: bool
    ) -> None:
        self.bus.publish(
            "task.conflict_unresolved",
            {
                "taskId": task.id,
                "agentId": agent_id,
                "files": left.files,
                "unmerged": left.unmerged,
                "lines": left.lines[:LINES_SHOWN],
                "willRetry": will_retry,
                "attempts": task.attempts,
                "maxAttempts": task.max_attempts,
            },
        )

    def _ask(self, task: Task, left: Leftover) -> None:
        text = (
            f"Task {task.id} ended with its merge conflict unresolved ({left.describe()})."
            f" Resolve it in its worktree ({task.worktree}) and answer 'check again'; or"
            " answer 'review anyway' to commit it as it is and review it (the merge refuses"
            " conflict markers unless the approve accepts them: gridctl task approve"
            " --accept-markers PATH); or 'agent' to send it back to its agent."
        )
        ask_human(
            self.questions,
            task,
            key="unresolved",
            kind=UNRESOLVED_QUESTION,
            text=text,
            options=ANSWERS,
            meta={"files": left.files},
        )

    def waits(self, task: Task) -> bool:
        """``task`` waits for a human's answer about its unresolved conflict."""
        return task.status == TaskStatus.BLOCKED and bool(task.conflict_unresolved)

    async def answered(self, question: Question, response: str) -> None:
        """A human's answer to the question ``refuse`` asked."""
        task = self.state.tasks.get(question.task_id)
        if task is None or not self.waits(task) or not task.worktree:
            return
        path = Path(task.worktree)
        base = task.base_commit or await self.worktrees.base_of(task.branch or "")
        left = await self.left_in(task, path, base)
        if response == "agent":
            if self.waits(task := self.state.tasks[task.id]):
                move_task(
                    self.state,
                    task.id,
                    TaskStatus.WORKING,
                    reason="conflict left unresolved; back to its agent (a human)",
                    feedback=unresolved_feedback(left) if left else None,
                    attempts=0,  # a new round, as after a reviewer's reject
                    sessions=0,
                    summary=None,
                )
            return
        if left and response == "check again":
            self._publish(task, left, agent_id=None, will_retry=False)
            self._ask(task, left)
            return
        _, changed = await self.worktrees.record(path, f"gridd: {task.id}: {task.title}", base=base)
        if not self.waits(task := self.state.tasks[task.id]):
            return  # cancelled (or started) meanwhile: the work is committed all the same
        move_task(
            self.state,
            task.id,
            TaskStatus.REVIEW,
            reason="conflict resolved by a human" if not left else "sent to review by a human",
            changed_files=changed,
            conflict_unresolved=left.files,
            error=f"sent to review with {left.describe()}" if left else None,
            summary=None,
            feedback=None,
        )
        self.state.flush()
