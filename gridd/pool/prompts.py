"""What an agent is told: its command line rendered from the profile, and its prompt.

A first run gets the task's prompt; a continued session gets the prompt plus the previous
session's summary; a run sent back (by a reviewer or the merge queue) gets the feedback.
Pure functions: no state, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gridd.model import Task

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def render_command(command: list[str], values: Mapping[str, str]) -> list[str]:
    """Substitute ``{prompt}``, ``{task_id}``, ``{worktree}`` inside arguments (no shell).

    One pass: a value is never searched for placeholders itself, so a prompt that mentions
    ``{worktree}`` reaches the agent as written. Unknown ``{names}`` are left alone.
    """

    def value_of(match: re.Match[str]) -> str:
        return values.get(match.group(1), match.group(0))

    return [_PLACEHOLDER.sub(value_of, arg) for arg in command]


def continuation_prompt(task: Task, session: int, *, rate_limited: bool = False) -> str:
    base_prompt = task.prompt or task.title
    summary = (task.summary or "").strip() or "(the previous session left no summary)"
    if rate_limited:
        return (
            f"{base_prompt}\n\n---\nThe earlier session on this task was interrupted by a"
            " rate limit (the provider's usage limit), which has now reset. Continue the task"
            " from where it stopped; the worktree and branch still hold its work."
            f" Where it stopped:\n{summary}"
        )
    return (
        f"{base_prompt}\n\n---\nThis is session {session} of {task.max_sessions} on this task."
        " The previous session ended by asking to continue. Its summary:\n"
        f"{summary}\n\nThe worktree and branch still hold its work; carry on from there."
    )


def feedback_prompt(task: Task) -> str:
    """The prompt of a run sent back by a reviewer (reject) or by the merge queue."""
    base_prompt = task.prompt or task.title
    return (
        f"{base_prompt}\n\n---\nYour earlier work on this task is in this worktree and on"
        f" its branch. It was sent back to you:\n\n{task.feedback}\n"
    )
