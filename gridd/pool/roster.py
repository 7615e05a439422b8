"""The roster: what this daemon knows, in memory, about agents live in it.

Handles and run watches of the agents it watches, the tasks being started or finished, the
stops in flight, and each task's backoff deadline. The pool fills it; the finisher
(``finish.py``) releases an agent from it when its run is finished; the scheduler reads it
to know what is busy. It is the one object the pool and the finisher share, so neither
imports the other (the finisher is handed to the pool as a callback).

Backoff deadlines are monotonic here and persisted with the task as wall-clock time
(``Task.backoff_until``), so a restart keeps them.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

from gridd.git.worktrees import Worktree
from gridd.model import TERMINAL_TASK_STATUSES, Task, utcnow
from gridd.runs.executor import AgentHandle
from gridd.runs.watch import RunWatch
from gridd.settings import SchedulerSettings


class Roster:
    def __init__(self, scheduler: SchedulerSettings) -> None:
        self.scheduler = scheduler
        self.handles: dict[str, AgentHandle] = {}
        self.runs: dict[str, RunWatch] = {}
        self.started_mono: dict[str, float] = {}
        self.starting: set[str] = set()
        #: Task ids whose agent has exited and is being finished (commit, new status): until
        #: that is done the task must not get another agent.
        self.finishing: set[str] = set()
        self.not_before: dict[str, float] = {}
        #: Agents with a stop in flight in this daemon (True: a kill). The status says
        #: ``stopping`` from an earlier daemon too; this says whether anyone acts on it.
        self.stops: dict[str, bool] = {}
        #: Task id -> resolved once its claim (beads) has been answered and acted on: an
        #: agent started while its claim was in flight is finished only after that.
        self.claims: dict[str, asyncio.Future[None]] = {}
        #: Task id -> the worktree of a run started before its claim was lost: its finish
        #: commits nothing and removes the worktree (the work was never ours to keep).
        self.disowned: dict[str, Worktree] = {}

    def release(self, agent_id: str) -> None:
        """Forget an agent whose run is over (it is being finished)."""
        self.handles.pop(agent_id, None)
        self.runs.pop(agent_id, None)
        self.started_mono.pop(agent_id, None)
        self.stops.pop(agent_id, None)

    # -- backoff ---------------------------------------------------------------------------------

    def backoff(self, attempts: int) -> float:
        sched = self.scheduler
        return float(
            min(sched.backoff_max_seconds, sched.backoff_seconds * 2 ** max(0, attempts - 1))
        )

    def back_off(self, task_id: str, attempts: int) -> datetime:
        """Hold the task back after a failure: a monotonic deadline for the scheduler, and
        the wall-clock deadline returned to be persisted with the task (``backoff_until``)."""
        delay = self.backoff(attempts)
        self.not_before[task_id] = time.monotonic() + delay
        return utcnow() + timedelta(seconds=delay)

    def restore_backoffs(self, tasks: list[Task]) -> None:
        """A restart keeps every persisted backoff (as the time still left of it)."""
        now_wall, now = utcnow(), time.monotonic()
        for task in tasks:
            if task.backoff_until is not None and task.status not in TERMINAL_TASK_STATUSES:
                left = (task.backoff_until - now_wall).total_seconds()
                if left > 0:
                    self.not_before[task.id] = now + left
