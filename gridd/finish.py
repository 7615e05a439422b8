"""Finishing an agent run: account its cost, decide what its exit means, apply it.

The decision is ``outcome.decide`` (pure); this module does the I/O around it. Work is never
thrown away: whatever the outcome, what the agent left in its worktree is committed on the
task's branch (a failed attempt's work is committed too, so the retry can build on it or
undo it; its failure is written beside it for the retry to read).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path

from gridd.errors import GriddError, StoreError
from gridd.events import EventBus
from gridd.faults import crash_point
from gridd.git.integrity import merge_head, own_worktree
from gridd.git.private import PrivateRepos
from gridd.git.unresolved import Unresolved
from gridd.git.worktrees import Worktree, Worktrees
from gridd.ids import kept_branch
from gridd.lifecycle import move_agent, move_task, update_session
from gridd.model import Agent, AgentStatus, Task, TaskStatus, utcnow
from gridd.outcome import (
    Block,
    Completed,
    Continue,
    Fail,
    Outcome,
    RateLimit,
    Retry,
    RunFacts,
    Stopped,
    decide,
    describe_exit,
)
from gridd.pool.roster import Roster
from gridd.questions import QuestionBook
from gridd.runs.executor import ExitStatus
from gridd.runs.output import OutputLog
from gridd.runs.watch import RunWatch
from gridd.settings import AgentProfile, Settings
from gridd.state import GridState

log = logging.getLogger(__name__)

FAILURE_TAIL_LINES = 200
#: Resume a rate-limited task this long after the reset the provider named.
RESET_MARGIN_SECONDS = 1.0
#: Pauses between tries when finishing a run fails transiently (a git lock, say).
FINISH_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)
#: Where a completed run's task may be when its result is recorded: still ``working``, or
#: moved by a stop (``ready``) or kill (``blocked``) that came after the run had ended.
_TAKES_RESULT = frozenset({TaskStatus.WORKING, TaskStatus.READY, TaskStatus.BLOCKED})


class Finisher:
    def __init__(
        self,
        *,
        settings: Settings,
        state: GridState,
        bus: EventBus,
        roster: Roster,
        profiles: Mapping[str, AgentProfile],
        worktrees: Worktrees,
        private: PrivateRepos,
        questions: QuestionBook,
        unresolved: Unresolved,
    ) -> None:
        self.settings = settings
        #: A sandboxed run's own repository: its commits are brought back first.
        self.private = private
        self.unresolved = unresolved
        self.state = state
        self.bus = bus
        self.roster = roster
        self.profiles = profiles
        self.worktrees = worktrees
        self.questions = questions
        #: Agent id -> its task's recent failure times, this run's failure included: what
        #: the run's outcome was decided on, written when the run is settled.
        self._failure_times: dict[str, list[datetime]] = {}

    async def finish(self, agent_id: str, status: ExitStatus, run: RunWatch) -> None:
        agent = self.state.agents[agent_id]
        self.roster.finishing.add(agent.task_id)
        self.state.touch()  # the agent has exited: its slot is free while its work is committed
        try:
            gate = self.roster.claims.get(agent.task_id)
            if gate is not None:  # started while its claim was in flight: wait for the answer
                await asyncio.shield(gate)
            disowned = self.roster.disowned.pop(agent.task_id, None)
            if disowned is not None:
                await self._disowned(agent, status, run, disowned)
            else:
                await self._finish(agent, status, run)
        finally:
            self.roster.finishing.discard(agent.task_id)
            self.state.flush()
            self.state.touch()  # the task may take an agent again

    async def _finish(self, agent: Agent, status: ExitStatus, run: RunWatch) -> None:
        handle = self.roster.handles.get(agent.id)
        self.roster.release(agent.id)
        task = self.state.tasks.get(agent.task_id)
        if task is None:
            await self._reclaim_or_log(agent)  # the worktree is left as a plain one
            self._settle(agent, status, run)
            return
        facts = self._facts(agent, task, status, run)
        outcome = decide(facts)
        error: Exception | None = None
        for delay in (*FINISH_RETRY_DELAYS, None):
            try:
                await self._reclaim(agent)
                await self._apply(agent, task, facts, outcome, (status, run))
                return
            except GriddError as exc:  # e.g. a git lock still held: wait and try again
                error = exc
                if delay is None or not exc.transient:
                    break
                log.warning("finishing agent %s: %s; retrying in %gs", agent.id, exc.message, delay)
                await asyncio.sleep(delay)
            except Exception as exc:  # not CancelledError: a stopping daemon leaves it to the next
                error = exc
                break
        if isinstance(error, StoreError) and handle is not None:
            # The state database refused the outcome (a full or read-only disk): the run
            # goes back to its monitor, which finishes it again once writes work, as a
            # restarted daemon would from exit.json. Nothing is spent or parked on it.
            self.roster.handles[agent.id] = handle
            self.roster.runs[agent.id] = run
            raise error
        self._unrecorded(agent, status, run, error)

    async def _disowned(
        self, agent: Agent, status: ExitStatus, run: RunWatch, worktree: Worktree
    ) -> None:
        """A run whose claim was lost (or never answered) while it ran: the work was never
        the task's. Nothing reaches the task's branch; whatever the agent did is kept on a
        branch of its own (``keptBranch``) for a human to look at, and the worktree goes
        so the task's next attempt (if any) starts afresh."""
        self.roster.release(agent.id)
        reason = self.state.agents[agent.id].stop_reason or "claim lost"
        await self._reclaim_or_log(agent)  # its commits go where the rest of its work goes
        # Set aside before the run is settled, as a normal finish records its work first:
        # until then the agent is live, so its task cannot start again in this worktree.
        kept = await self.worktrees.set_aside(
            worktree,
            keep_as=kept_branch(agent.task_id, agent.id),
            message=f"gridd: work of agent {agent.id} on {agent.task_id}, kept ({reason})",
        )
        agent = self._settle(self.state.agents[agent.id], status, run)
        self.bus.publish(
            "agent.stopped",
            {
                "agentId": agent.id,
                "taskId": agent.task_id,
                "reason": reason,
                "exitCode": status.code,
                "committedWork": False,
                "keptBranch": kept,
            },
        )

    async def _reclaim(self, agent: Agent) -> None:
        """A sandboxed run's commits, from its own repository onto the task's branch, and
        the worktree a plain one again (``git/private.py``), before anything is committed
        there. A run whose history could not be brought back is said so; its files are
        recorded all the same."""
        reclaimed = await self.private.reclaim(Path(agent.worktree_path))
        if reclaimed is not None and reclaimed.problem:
            warning = f"the run's own commits were not brought back: {reclaimed.problem}"
            log.warning("agent %s: %s", agent.id, warning)
            self.bus.publish("agent.warning", {"agentId": agent.id, "warning": warning})
        if reclaimed is not None:
            crash_point(self.settings, "finish.reclaimed")

    async def _reclaim_or_log(self, agent: Agent) -> None:
        try:
            await self._reclaim(agent)
        except (GriddError, OSError) as exc:
            log.error("agent %s: its own repository could not be reclaimed: %s", agent.id, exc)

    def _unrecorded(
        self, agent: Agent, status: ExitStatus, run: RunWatch, error: Exception | None
    ) -> None:
        """The run's outcome could not be applied: settle it and park its task for a human
        (running the agent again over work that could not be committed helps nobody)."""
        message = error.message if isinstance(error, GriddError) else repr(error)
        log.error("finishing agent %s failed: %s", agent.id, message, exc_info=error)
        self.bus.publish(
            "agent.finish_failed",
            {"agentId": agent.id, "taskId": agent.task_id, "error": message},
        )
        if self.state.agents[agent.id].status != AgentStatus.EXITED:
            self._settle(agent, status, run)
        task = self.state.tasks.get(agent.task_id)
        if task is not None and task.status == TaskStatus.WORKING:
            move_task(
                self.state,
                task.id,
                TaskStatus.BLOCKED,
                reason="finishing failed",
                error=f"could not record the agent's work: {message}",
            )

    def _settle(self, agent: Agent, status: ExitStatus, run: RunWatch) -> Agent:
        """Record the exit and account its cost. Called with no ``await`` before the task's
        new status: until then the agent is still live on disk, so a daemon killed while its
        work is being committed finishes it again from ``exit.json`` on the next start."""
        profile = self.profiles.get(agent.profile)
        # The run's own report; else what it reported before a daemon restart (persisted on
        # the agent); else the profile's estimate. Added to the task and session once: here.
        cost = run.cost if run.cost is not None else agent.cost_usd
        if cost is None and profile is not None:
            cost = profile.cost_per_session
        agent = move_agent(
            self.state,
            agent.id,
            AgentStatus.EXITED,
            reason=f"exited ({status.code})" if status.error is None else status.error[:200],
            ended_at=utcnow(),
            exit_code=status.code,
            error=status.error,
            exit_reason=status.reason,
            cost_usd=cost,
            output_seq=run.output.seq,
            heartbeat_offset=run.heartbeats.offset,
            session_id=run.session_id or agent.session_id,
            # Its claim was answered (or cannot be any more): only a live run waits on one.
            claim_pending=False,
        )
        self.questions.close_for_agent(
            agent.id,
            f"the agent was stopped: {agent.stop_reason}"
            if agent.stop_reason
            else "the agent exited before an answer",
        )
        task = self.state.tasks.get(agent.task_id)
        failures = self._failure_times.pop(agent.id, None)
        if failures is not None and task is not None:
            task = self.state.update_task(task.id, failure_times=failures)
        if cost and task is not None:
            self.state.update_task(task.id, cost_usd=task.cost_usd + cost)
        if cost:
            update_session(self.state, spent_usd=self.state.session.spent_usd + cost)
        return agent

    def _facts(self, agent: Agent, task: Task, status: ExitStatus, run: RunWatch) -> RunFacts:
        wants = task.status == TaskStatus.WORKING
        # No signal of gridd's reached the agent: a stop asked for after it had exited
        # neither failed the run nor undoes its result.
        ended_first = agent.signalled_at is None
        failed = status.code != 0 or (agent.stop_reason is not None and not ended_first)
        recent = 0
        if wants and failed and not run.continue_requested:
            # Persisted with the task (wall clock): a restart does not reset the flap count.
            now = utcnow()
            window = timedelta(seconds=self.settings.scheduler.flap_window_seconds)
            times = [t for t in task.failure_times if now - t <= window] + [now]
            # Written when the run is settled (``_settle``), not here: a finish cut short
            # between the two (a stopping daemon, a kill) is finished again on the next
            # start, and would count this failure twice.
            self._failure_times[agent.id] = times
            recent = len(times)
        return RunFacts(
            exit_code=status.exit_code,
            signal=status.signal,
            error=status.error,
            stop_reason=agent.stop_reason,
            task_wants_run=wants,
            continue_requested=run.continue_requested,
            summary=run.summary,
            rate_limited=run.rate_limited,
            rate_limited_until=run.rate_limited_until,
            launch_failed=run.launch_failed,
            result_ok=run.result.ok if run.result is not None else None,
            result_text=run.result.text if run.result is not None else "",
            session_ended=run.session_ended,
            attempts=task.attempts,
            max_attempts=task.max_attempts,
            sessions=task.sessions,
            max_sessions=task.max_sessions,
            recent_failures=recent,
            flap_limit=self.settings.scheduler.flap_failures,
            ended_first=ended_first,
        )

    async def _commit(self, agent: Agent, message: str) -> bool:
        """Commit a run's work in progress. Not in the middle of a merge: that one is
        concluded only by a completed run that left no conflict (``_apply``), never with
        its markers by a stopped or failed one; the work stays as it is, for the next run."""
        path = Path(agent.worktree_path)
        git_dir = await own_worktree(self.worktrees.root, path)  # never anyone else's checkout
        if merge_head(git_dir):
            log.info("%s: a merge is in progress in %s; nothing committed", agent.id, path)
            return False
        return await self.worktrees.commit_all(path, message)

    async def _apply(
        self,
        agent: Agent,
        task: Task,
        facts: RunFacts,
        outcome: Outcome,
        ended: tuple[ExitStatus, RunWatch],
    ) -> None:
        """Commit the run's work, then (with no ``await`` in between) settle the agent and
        give the task its new status."""
        ids = {"agentId": agent.id, "taskId": task.id}
        if isinstance(outcome, Stopped):
            committed = await self._commit(
                agent, f"gridd: {task.id}: work in progress (agent stopped)"
            )
            agent = self._settle(agent, *ended)
            self.bus.publish(
                "agent.stopped",
                {
                    **ids,
                    "reason": outcome.reason,
                    "exitCode": facts.code,
                    "committedWork": committed,
                },
            )
        elif isinstance(outcome, Completed):
            path = Path(agent.worktree_path)
            base = task.base_commit or await self.worktrees.base_of(task.branch or "")
            # git's own word before anything is committed: a conflict left in the worktree
            # is neither committed nor reviewed (``git/unresolved.py`` says what next).
            left = await self.unresolved.left_in(task, path, base)
            if left:
                agent = self._settle(agent, *ended)
                if not self._overtaken(agent, task.id, facts, False):  # a stop or cancel wins
                    self.unresolved.refuse(self.state.tasks[task.id], left, agent_id=agent.id)
                return
            _, changed = await self.worktrees.record(
                path, f"gridd: {task.id}: {task.title}", base=base
            )
            agent = self._settle(agent, *ended)
            kept = self._to_review(task.id, changed)
            self.bus.publish(
                "agent.completed",
                {
                    **ids,
                    "result": "success",
                    "changedFiles": changed,
                    "branch": task.branch,
                    "costUsd": agent.cost_usd,
                    "summary": facts.summary[-1000:] or None,
                    "keptBranch": kept,
                },
            )
        elif isinstance(outcome, Continue):
            committed = await self._commit(
                agent, f"gridd: {task.id}: session {task.sessions} (continuing)"
            )
            agent = self._settle(agent, *ended)
            if self._overtaken(agent, task.id, facts, committed):
                return
            move_task(
                self.state,
                task.id,
                TaskStatus.READY,
                reason="agent asked to continue",
                summary=outcome.summary,
            )
            self.bus.publish(
                "agent.continued",
                {
                    **ids,
                    "session": task.sessions,
                    "maxSessions": task.max_sessions,
                    "summary": outcome.summary[-1000:],
                },
            )
        elif isinstance(outcome, RateLimit):
            committed = await self._commit(
                agent, f"gridd: {task.id}: work in progress (rate limited)"
            )
            agent = self._settle(agent, *ended)
            if self._overtaken(agent, task.id, facts, committed):
                return
            # The exact reset plus a small margin (the provider's clock and ours differ a
            # little); without a reset time, the configured backoff.
            until = (
                outcome.until + timedelta(seconds=RESET_MARGIN_SECONDS)
                if outcome.until is not None
                else utcnow()
                + timedelta(seconds=self.settings.scheduler.rate_limit_backoff_seconds)
            )
            # Resuming continues this session's work (same worktree, a continuation prompt).
            move_task(
                self.state,
                task.id,
                TaskStatus.RATE_LIMITED,
                reason="usage limit reached",
                resume_at=until,
                error="usage limit reached",
                summary=facts.summary or task.summary or "stopped by the provider's usage limit",
            )
            limit = ended[1].rate_limit
            self.bus.publish(
                "task.rate_limited",
                {
                    **ids,
                    "resumeAt": until.isoformat(),
                    "autoResume": self.settings.scheduler.auto_resume,
                    "limitType": limit.limit_type if limit else None,
                    "source": limit.source if limit and outcome.until else "backoff",
                },
            )
        else:
            await self._fail(agent, task, facts, outcome, ended)

    async def _fail(
        self,
        agent: Agent,
        task: Task,
        facts: RunFacts,
        outcome: Retry | Fail | Block,
        ended: tuple[ExitStatus, RunWatch],
    ) -> None:
        error = outcome.error
        failure_file = self._write_failure(agent, task, facts, error)
        committed = await self._commit(
            agent, f"gridd: {task.id}: work of failed attempt {task.attempts}"
        )
        agent = self._settle(agent, *ended)
        if self._overtaken(agent, task.id, facts, committed):
            return
        self.bus.publish(
            "agent.failed",
            {
                "agentId": agent.id,
                "taskId": task.id,
                "error": error,
                "exitCode": facts.code,
                "exitReason": ended[0].reason,
                "willRetry": isinstance(outcome, Retry),
                "failureFile": str(failure_file),
            },
        )
        if isinstance(outcome, Retry):
            until = self.roster.back_off(task.id, task.attempts)
            move_task(
                self.state,
                task.id,
                TaskStatus.READY,
                reason="attempt failed; retrying",
                error=error,
                backoff_until=until,
                sessions=0,
                summary=None,
            )
        elif isinstance(outcome, Fail):
            move_task(
                self.state, task.id, TaskStatus.FAILED, reason="attempts used up", error=error
            )
        else:
            move_task(self.state, task.id, TaskStatus.BLOCKED, reason="needs a human", error=error)

    def _to_review(self, task_id: str, changed: list[str]) -> str | None:
        """A completed run's result goes to its task: ``review``, also when a stop or kill
        came in after the run had ended (the task is ``ready`` or ``blocked`` by then: the
        stop found nothing left to stop). A task cancelled meanwhile stays cancelled (it is
        terminal): the work stays on its branch, which the task names as ``keptBranch``.
        Returns that kept branch, or None when the task took the result."""
        task = self.state.tasks.get(task_id)
        if task is None:
            return None
        if task.status in _TAKES_RESULT:
            reason = "agent completed"
            if task.status != TaskStatus.WORKING:
                reason = f"agent completed before the stop reached it ({task.status_reason})"
            move_task(
                self.state,
                task_id,
                TaskStatus.REVIEW,
                reason=reason,
                changed_files=changed,
                error=None,
                summary=None,
                conflict_unresolved=[],
            )
            return None
        self.state.update_task(task_id, kept_branch=task.branch, changed_files=changed)
        log.info(
            "task %s is %s; its completed work is kept on %s", task_id, task.status, task.branch
        )
        return task.branch

    def _overtaken(self, agent: Agent, task_id: str, facts: RunFacts, committed: bool) -> bool:
        """A stop, kill or cancel came in while this run's work was being committed: the
        run's own outcome (continue, retry, fail, rate limit) no longer applies. The task
        stays where that request put it, as if it had come before the run ended
        (``agent.stopped``). False while the task still wants the outcome."""
        task = self.state.tasks.get(task_id)
        if task is not None and task.status == TaskStatus.WORKING:
            return False
        self.bus.publish(
            "agent.stopped",
            {
                "agentId": agent.id,
                "taskId": task_id,
                "reason": agent.stop_reason or (task.status_reason if task else None) or "stopped",
                "exitCode": facts.code,
                "committedWork": committed,
            },
        )
        return True

    def _write_failure(self, agent: Agent, task: Task, facts: RunFacts, error: str) -> Path:
        """What the next attempt should know (``GRID_PREVIOUS_FAILURE``)."""
        path = Path(agent.run_dir) / "failure.md"
        tail = ""
        try:
            lines = OutputLog(Path(agent.run_dir), writer=False).tail_text(256 * 1024).splitlines()
            tail = "\n".join(lines[-FAILURE_TAIL_LINES:])
        except OSError:
            pass
        tried = (task.prompt or task.title).strip()
        text = (
            f"# Attempt {task.attempts} of task {task.id} failed\n\n"
            f"- task: {task.title}\n- agent: {agent.id} (profile {agent.profile})\n"
            f"- exit code: {facts.code}\n- error: {error or describe_exit(facts)}\n"
            f"- session: {agent.session_number}; last activity: {agent.activity or '-'}"
            f"; last message: {agent.message or '-'}\n\n"
            f"## What was tried\n\n{tried[:4000]}\n\n"
            f"## The last {FAILURE_TAIL_LINES} lines of output\n\n```\n{tail}\n```\n"
        )
        try:
            path.write_text(text)
        except OSError as exc:
            log.warning("could not write %s: %s", path, exc)
        return path
