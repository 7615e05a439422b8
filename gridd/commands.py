"""Intents: what the API may ask for, checked against the state and recorded as intent.

Nothing here spawns or kills a process directly: a command changes the state (a task's
status, the session) and wakes the scheduler, which converges the world to it. Every
refusal is a 4xx that says why (409 for a clash with the current state, 422 for invalid
values, 404 for unknown ids).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gridd.errors import Conflict, NotFound, ValidationFailed
from gridd.faults import crash_point
from gridd.git import feature
from gridd.git.merge import MergeGate
from gridd.git.on_conflict import merge_asker
from gridd.git.review import keep_review_edits
from gridd.git.worktrees import Worktrees
from gridd.ids import new_task_id, task_id_problem
from gridd.lean import BulkPace
from gridd.lifecycle import (
    create_tasks,
    create_tasks_yielding,
    first_statuses,
    intend_stop,
    move_task,
    task_can_move,
    update_session,
)
from gridd.model import Agent, AgentStatus, Question, SessionState, Task, TaskStatus, utcnow
from gridd.plan import GraphProblem, graph_problems, undone_dependencies, waves
from gridd.pool import AgentPool
from gridd.questions import QuestionBook
from gridd.scheduler import Scheduler
from gridd.settings import Settings
from gridd.specs import SessionStart, TaskPatch, TaskSpec
from gridd.state import GridState

log = logging.getLogger(__name__)

#: A request creating more tasks than this is built off the event loop and written in
#: chunks that yield (``Commands.create_tasks_yielding``).
YIELD_ABOVE = 500
#: Tasks built, or made ready, per turn of the loop in a big request (about 2 ms each).
BUILD_CHUNK = 100

_STARTABLE = frozenset(
    {
        TaskStatus.PENDING,
        TaskStatus.READY,
        TaskStatus.FAILED,
        TaskStatus.BLOCKED,
        TaskStatus.RATE_LIMITED,  # resumed by hand (say, with auto_resume = false)
    }
)


class Commands:
    def __init__(
        self,
        *,
        settings: Settings,
        state: GridState,
        pool: AgentPool,
        scheduler: Scheduler,
        questions: QuestionBook,
        merge_gate: MergeGate,
        root: Path,
        worktrees: Worktrees,
        ask_sources: Callable[[str], Awaitable[bool]] | None = None,
        merge_answers: Callable[[Question, str], None] | None = None,
    ) -> None:
        self.root = root
        #: Held by the merge queue while it decides a merging task's fate (a merge landing).
        self.merge_gate = merge_gate
        self.worktrees = worktrees
        #: Asks the task sources (beads) now whether they hold an id gridd does not know.
        self.ask_sources = ask_sources
        self._session_lock = asyncio.Lock()
        self._approve_lock = asyncio.Lock()
        #: Delivers a human's answer to a merge question to the policy that asked it.
        self.merge_answers = merge_answers
        self.settings = settings
        self.state = state
        self.pool = pool
        self.scheduler = scheduler
        self.questions = questions

    # -- lookups ---------------------------------------------------------------------------------

    def task(self, task_id: str) -> Task:
        problem = task_id_problem(task_id)
        if problem is not None:
            raise ValidationFailed(
                f"invalid task id {task_id[:80]!r}: {problem}", code="invalid_task_id"
            )
        task = self.state.tasks.get(task_id)
        if task is None:
            raise NotFound(f"no task {task_id!r}", code="task_not_found", details={"id": task_id})
        return task

    def agent(self, agent_id: str) -> Agent:
        agent = self.state.agents.get(agent_id)
        if agent is None:
            raise NotFound(
                f"no agent {agent_id[:80]!r}", code="agent_not_found", details={"id": agent_id[:80]}
            )
        return agent

    # -- tasks -----------------------------------------------------------------------------------

    def create_from_source(self, fields: dict[str, Any], *, source: str) -> Task:
        """One task from an external source (beads), checked and created exactly as
        ``POST /tasks`` creates one: the same ``TaskSpec`` validation (ids, text that reaches
        git), the same defaults (``maxAttempts``, ``maxSessions``), the same graph checks.
        Raises ``ValidationFailed`` (or ``Conflict``) saying what is wrong."""
        try:
            spec = TaskSpec.model_validate(fields)
        except ValidationError as exc:
            problems = [
                {"field": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]}
                for e in exc.errors()
            ]
            first = problems[0]
            raise ValidationFailed(
                f"invalid task from {source}: {first['field']}: {first['problem']}",
                code="invalid_task",
                details={"problems": problems},
            ) from None
        return self.create_tasks([spec], source=source)[0]

    def create_tasks(self, specs: list[TaskSpec], *, source: str = "native") -> list[Task]:
        """Create tasks atomically: any problem in the batch and nothing is applied."""
        existing = {t.id: t.depends_on for t in self.state.tasks.values()}
        ready = self._built(specs, source=source, existing=existing, statuses=self.state.statuses())
        created = create_tasks(self.state, ready)
        self.state.flush()
        return created

    async def create_tasks_yielding(
        self, specs: list[TaskSpec], *, source: str = "native"
    ) -> list[Task]:
        """``create_tasks`` for a request of any size. Past ``YIELD_ABOVE`` tasks they are
        built, made ready and written in chunks of ``BUILD_CHUNK`` with a turn of the loop
        between them (``lean.BulkPace``, which also keeps the cycle collector's walks short),
        and checked against the graph on a worker thread: 50,000 tasks never hold the event
        loop for long. Still all or nothing: an id another request took meanwhile refuses
        the whole batch, as a duplicate does (``GridState.add_tasks_yielding``)."""
        if len(specs) <= YIELD_ABOVE:
            return self.create_tasks(specs, source=source)
        pace = BulkPace()
        known = list(self.state.tasks.values())  # the graph as it is now (a copy)
        now = utcnow()
        tasks: list[Task] = []
        for start in range(0, len(specs), BUILD_CHUNK):
            tasks += self._new_tasks(specs[start : start + BUILD_CHUNK], source=source, now=now)
            await pace.step(BUILD_CHUNK)
        problems, existing, statuses = await asyncio.to_thread(_checked, tasks, known)
        del known
        _refuse(problems, existing)
        del existing
        ready: list[Task] = []
        for start in range(0, len(tasks), BUILD_CHUNK):
            ready += first_statuses(tasks[start : start + BUILD_CHUNK], statuses)
            await pace.step(BUILD_CHUNK)
        del tasks, statuses
        return await create_tasks_yielding(self.state, ready, pace=pace)

    def _built(
        self,
        specs: list[TaskSpec],
        *,
        source: str,
        existing: dict[str, list[str]],
        statuses: dict[str, TaskStatus],
    ) -> list[Task]:
        """The tasks ``specs`` ask for, each ready or not, checked against ``existing``
        (id -> dependencies) and ``statuses``; the first problem raises."""
        tasks = self._new_tasks(specs, source=source, now=utcnow())
        _refuse(graph_problems([(t.id, t.depends_on) for t in tasks], existing), existing)
        return first_statuses(tasks, {**statuses, **{t.id: t.status for t in tasks}})

    def _new_tasks(self, specs: list[TaskSpec], *, source: str, now: datetime) -> list[Task]:
        """The tasks ``specs`` ask for, not yet checked against the graph; an unknown agent
        profile raises."""
        profiles = self.pool.profiles
        tasks = []
        for spec in specs:
            if spec.agent is not None and spec.agent not in profiles:
                raise ValidationFailed(
                    f"task {spec.id or spec.title!r} names unknown agent profile {spec.agent!r}",
                    code="unknown_profile",
                    details={"agent": spec.agent, "known": sorted(profiles)},
                )
            tasks.append(
                Task(
                    id=spec.id or new_task_id(spec.title),
                    title=spec.title,
                    prompt=spec.prompt,
                    priority=spec.priority,
                    depends_on=spec.depends_on,
                    labels=spec.labels,
                    agent=spec.agent,
                    max_attempts=spec.max_attempts or self.settings.scheduler.max_attempts,
                    max_sessions=spec.max_sessions or self.settings.scheduler.max_sessions,
                    timeout_seconds=spec.timeout_seconds,
                    files=spec.files,
                    source=source,
                    created_at=now,
                    updated_at=now,
                )
            )
        return tasks

    def patch_task(self, task_id: str, patch: TaskPatch) -> Task:
        task = self.task(task_id)
        changes: dict[str, Any] = patch.model_dump(exclude_unset=True)
        if (
            "agent" in changes
            and changes["agent"] is not None
            and changes["agent"] not in self.pool.profiles
        ):
            raise ValidationFailed(
                f"unknown agent profile {changes['agent']!r}", code="unknown_profile"
            )
        if "depends_on" in changes:
            if task.status not in (TaskStatus.PENDING, TaskStatus.READY, TaskStatus.BLOCKED):
                raise Conflict(
                    f"task {task_id!r} is {task.status.value}; dependencies can only change before it starts"
                )
            others = {t.id: t.depends_on for t in self.state.tasks.values() if t.id != task_id}
            problems = graph_problems([(task_id, changes["depends_on"])], others)
            if problems:
                raise ValidationFailed(problems[0].message, code=f"plan_{problems[0].kind}")
            if task.status == TaskStatus.READY:
                # The scheduler re-derives readiness from the new dependencies.
                updated = move_task(
                    self.state,
                    task_id,
                    TaskStatus.PENDING,
                    reason="dependencies changed",
                    **changes,
                )
                self.state.flush()
                return updated
        updated = self.state.update_task(task_id, **changes)
        self.state.flush()
        return updated

    async def settled_task(self, task_id: str) -> Task:
        """The task once the merge queue is not deciding its fate: a merge that is landing
        lands (the task is then ``done``) or is abandoned before a command looks at it."""
        self.task(task_id)  # 404 / 422 first
        await self.merge_gate.settled(task_id)
        return self.task(task_id)

    async def cancel_task(self, task_id: str) -> Task:
        task = await self.settled_task(task_id)
        if task.status == TaskStatus.CANCELLED or not task_can_move(
            task.status, TaskStatus.CANCELLED
        ):
            raise Conflict(
                f"task {task_id!r} is already {task.status.value}{_merged_note(task)}",
                code="task_finished",
                details=_status_details(task),
            )
        updated = move_task(
            self.state, task_id, TaskStatus.CANCELLED, reason="cancelled by user", error="cancelled"
        )
        self.state.flush()
        crash_point(self.settings, "intent.recorded")
        return updated

    def start_task(self, task_id: str) -> Task:
        task = self.task(task_id)
        if task.status == TaskStatus.WORKING:
            raise Conflict(f"task {task_id!r} is already working", code="task_working")
        if task.status not in _STARTABLE:
            raise Conflict(
                f"task {task_id!r} is {task.status.value} and cannot be started",
                code="task_not_startable",
            )
        missing = undone_dependencies(task, self.state.statuses())
        if missing:
            raise Conflict(
                f"task {task_id!r} waits for unfinished dependencies: {', '.join(missing)}",
                code="dependencies_not_done",
                details={"dependencies": missing},
            )
        changes: dict[str, Any] = {"error": None, "backoff_until": None}
        if task.status in (TaskStatus.FAILED, TaskStatus.BLOCKED):
            changes.update(attempts=0, sessions=0, summary=None)
        elif task.status == TaskStatus.RATE_LIMITED:
            changes.update(resume_at=None)  # it continues the parked session's work
        self.pool.clear_backoff(task_id)
        updated = move_task(
            self.state, task_id, TaskStatus.WORKING, reason="started by user", **changes
        )
        # a question about a conflict its last run left unresolved is moot now
        self.questions.close_for_agent(merge_asker(task_id), "the task was started again")
        self.state.flush()
        return updated

    async def start_any_task(self, task_id: str) -> Task:
        """``POST /tasks/{id}/start``: an id gridd does not know may be a bead made since the
        last read, so the sources are asked once before the 404."""
        if (
            task_id not in self.state.tasks
            and task_id_problem(task_id) is None
            and self.ask_sources is not None
        ):
            await self.ask_sources(task_id)
        return self.start_task(task_id)

    async def stop_task(self, task_id: str) -> Task:
        task = await self.settled_task(task_id)
        if task.status != TaskStatus.WORKING:
            raise Conflict(
                f"task {task_id!r} is {task.status.value}{_merged_note(task)}, not working",
                code="task_not_working",
                details=_status_details(task),
            )
        updated = move_task(self.state, task_id, TaskStatus.READY, reason="stopped by user")
        agent = self.state.agent_for_task(task_id)
        if agent is not None:
            self._intend(agent.id, "stop", "task stopped by user")
        self.state.flush()
        crash_point(self.settings, "intent.recorded")
        return updated

    def _in_review(self, task_id: str) -> Task:
        task = self.task(task_id)
        if task.status != TaskStatus.REVIEW:
            raise Conflict(
                f"task {task_id!r} is {task.status.value}{_merged_note(task)}; only a task"
                " in review can be approved",
                code="task_not_in_review",
                details=_status_details(task),
            )
        return task

    async def approve_task(self, task_id: str, *, accept_markers: list[str] | None = None) -> Task:
        """Queue a task in review for the merge. What the reviewer left uncommitted in its
        worktree is committed first, or refused (``[merge] review_edits``); ``accept_markers``
        (paths, globs) may keep marker-like lines the merge would otherwise refuse."""
        self._in_review(task_id)
        async with self._approve_lock:  # one review commit at a time
            kept = await keep_review_edits(
                self.worktrees,
                self._in_review(task_id),
                mode=self.settings.merge.review_edits,
            )
        task = self._in_review(task_id)  # it may have moved meanwhile
        accepted = list(dict.fromkeys(accept_markers or []))
        if kept is not None:
            if task.base_commit:
                task = self.state.update_task(task_id, changed_files=kept.changed)
            self.state.bus.publish(
                "task.review_edits",
                {"taskId": task_id, "commit": kept.commit, "files": kept.files},
            )
        if self.state.session.feature_branch is None or task.branch is None:
            # No feature branch to merge into (or no work to merge): approval is the end.
            updated = move_task(
                self.state, task_id, TaskStatus.DONE, reason="approved", feedback=None
            )
        else:
            updated = move_task(
                self.state,
                task_id,
                TaskStatus.MERGING,
                reason="approved; queued for the merge",
                merge_queued_at=utcnow(),
                merge_commit=None,
                feedback=None,
                error=None,
                accepted_markers=accepted,
            )
            queued: dict[str, Any] = {
                "taskId": task_id,
                "featureBranch": self.state.session.feature_branch,
            }
            if accepted:
                queued["acceptMarkers"] = accepted
            self.state.bus.publish("task.merge_queued", queued)
        self.questions.close_for_agent(merge_asker(task_id), "the task was approved")
        self.state.flush()
        crash_point(self.settings, "intent.recorded")
        return updated

    async def approve_all(self) -> list[Task]:
        """Approve every task in review, in the order they reached it."""
        waiting = [t for t in self.state.tasks.values() if t.status == TaskStatus.REVIEW]
        waiting.sort(key=lambda t: (t.updated_at, t.id))
        return [await self.approve_task(t.id) for t in waiting]

    async def reject_task(self, task_id: str, feedback: str) -> Task:
        """Send a task in review back to its agent, in its worktree, with the feedback."""
        task = await self.settled_task(task_id)
        if task.status != TaskStatus.REVIEW:
            raise Conflict(
                f"task {task_id!r} is {task.status.value}{_merged_note(task)}; only a task"
                " in review can be rejected",
                code="task_not_in_review",
                details=_status_details(task),
            )
        updated = move_task(
            self.state,
            task_id,
            TaskStatus.WORKING,
            reason="rejected by a reviewer",
            feedback=feedback,
            attempts=0,  # a new round of work: maxAttempts counts failed runs, not reviews
            sessions=0,
            summary=None,
            error=None,
        )
        self.pool.clear_backoff(task_id)
        self.questions.close_for_agent(merge_asker(task_id), "the task was rejected")
        self.state.bus.publish("task.rejected", {"taskId": task_id, "feedback": feedback[:4000]})
        self.state.flush()
        crash_point(self.settings, "intent.recorded")
        return updated

    def waves(self) -> list[list[str]]:
        graph = {t.id: t.depends_on for t in self.state.tasks.values()}
        return waves(graph)

    # -- the session ------------------------------------------------------------------------------

    async def begin_session(self, req: SessionStart) -> SessionState:
        """``POST /session/start``: the feature branch first (validated, refused while
        checked out, created once), then the session, so no task spawns before it exists."""
        if req.feature_branch is None:
            return self.start_session(req)
        async with self._session_lock:
            self._refuse_retarget(req.feature_branch)  # before the new branch is made
            branch = await feature.prepare(self.root, req.feature_branch, req.base_branch)
            if branch.created:
                self.state.bus.publish(
                    "session.branch_created",
                    {
                        "featureBranch": branch.name,
                        "baseBranch": branch.base_branch,
                        "commit": branch.tip,
                    },
                )
            return self.start_session(req, branch=branch)

    def start_session(
        self, req: SessionStart, *, branch: feature.FeatureBranch | None = None
    ) -> SessionState:
        current = self.state.session
        max_agents = req.max_agents or self.settings.scheduler.max_agents
        if "budget_usd" in req.model_fields_set:
            budget = req.budget_usd  # an explicit null means: no cap (warned about below)
        else:
            budget = self.settings.scheduler.budget_usd
        self._refuse_retarget(req.feature_branch)
        if current.started and req.feature_branch == current.feature_branch:
            changes: dict[str, Any] = {"max_agents": max_agents, "budget_usd": budget}
            if req.on_conflict is not None:
                changes["on_conflict"] = req.on_conflict
            session = update_session(self.state, **changes)
            if budget is None and current.budget_usd is not None:
                self.scheduler.warn_unbudgeted()
            return session
        self.scheduler.start_session(req.feature_branch, max_agents, budget)
        return update_session(
            self.state,
            base_branch=branch.base_branch if branch else None,
            base_commit=branch.base_commit if branch else None,
            on_conflict=req.on_conflict or self.settings.merge.on_conflict,
        )

    def _refuse_retarget(self, wanted: str | None) -> None:
        """One session, one feature branch: a session on another branch may start only once
        the current one is stopped and none of its tasks waits in review or the merge queue
        (they would land on the new branch with the old one's history). 409 ``session_running``."""
        current = self.state.session
        if wanted == current.feature_branch:
            return
        held = []
        if current.feature_branch is not None:
            held = sorted(
                t.id
                for t in self.state.tasks.values()
                if t.status in (TaskStatus.REVIEW, TaskStatus.MERGING)
            )
        if not current.started and not held:
            return
        name = current.feature_branch or "(no feature branch)"
        todo = []
        if current.started:
            todo.append("run 'gridctl session stop'")
        if held:
            shown = ", ".join(held[:10]) + (f" and {len(held) - 10} more" if len(held) > 10 else "")
            todo.append(
                f"approve or cancel its tasks in review or merging ({shown}) and let their"
                " merges finish"
            )
        state = "is running" if current.started else "still has work in review or merging"
        raise Conflict(
            f"the session on {name!r} {state}; to work on {wanted or '(no feature branch)'!r},"
            f" {' and '.join(todo)}, then start the session again",
            code="session_running",
            details={
                "featureBranch": current.feature_branch,
                "requested": wanted,
                "running": current.started,
                "tasks": held,
            },
        )

    def stop_session(self, *, force: bool) -> SessionState:
        if not self.state.session.started and not self.state.live_agents():
            return self.state.session  # nothing to stop; stopping twice is not an error
        return self.scheduler.stop_session("user", force=force)

    # -- agents ----------------------------------------------------------------------------------------

    def kill_agent(self, agent_id: str) -> Agent:
        agent = self.agent(agent_id)
        if agent.status == AgentStatus.EXITED:
            raise Conflict(f"agent {agent_id!r} has already exited", code="agent_exited")
        task = self.state.tasks.get(agent.task_id)
        if task is not None and task.status == TaskStatus.WORKING:
            # A human killed it: park the task for a human rather than retrying at once.
            move_task(
                self.state,
                task.id,
                TaskStatus.BLOCKED,
                reason="agent killed by user",
                error="agent killed by user",
            )
        self._intend(agent_id, "kill", "killed by user")
        self.state.flush()
        crash_point(self.settings, "intent.recorded")
        return self.state.agents[agent_id]

    def _intend(self, agent_id: str, intent: str, reason: str) -> None:
        intend_stop(self.state, agent_id, intent, reason)

    def respond(self, agent_id: str, text: str) -> Question | None:
        """covend's respond: answers the agent's oldest open question, or, when it has
        none, sends the text to its stdin as one line."""
        agent = self.agent(agent_id)
        if agent.status == AgentStatus.EXITED or agent_id not in self.pool.handles:
            raise Conflict(f"agent {agent_id!r} is not running", code="agent_not_running")
        pending = self.questions.pending_for(agent_id)
        if pending:
            return self.answer(pending[0].id, text)
        self.pool.follow_up(agent_id, text)
        self.state.bus.publish("agent.responded", {"agentId": agent_id, "taskId": agent.task_id})
        return None

    def answer(self, question_id: str, text: str) -> Question:
        question = self.questions.get(question_id)
        if question.agent_id == merge_asker(question.task_id) and self.merge_answers is not None:
            answered = self.questions.answer(question_id, text, deliver=self.merge_answers)
        else:
            answered = self.questions.answer(question_id, text, deliver=self.pool.deliver_answer)
        self.state.flush()
        return answered

    def question(self, question_id: str) -> Question:
        return self.questions.get(question_id)

    def output(self, agent_id: str, since: int, limit: int) -> dict[str, Any]:
        agent = self.agent(agent_id)
        log_ = self.pool.output_log(agent)
        chunks = log_.read_since(since, limit=limit)
        return {
            "agentId": agent_id,
            "taskId": agent.task_id,
            "seq": log_.seq,
            "chunks": [{"seq": c.seq, "chunk": c.text} for c in chunks],
            "more": bool(chunks) and chunks[-1].seq < log_.seq,
        }


def _status_details(task: Task) -> dict[str, Any]:
    """What a refusal says of the task: its status, and where its work went if merged."""
    details: dict[str, Any] = {"id": task.id, "status": task.status.value}
    if task.status == TaskStatus.DONE and task.merge_commit:
        details["mergeCommit"] = task.merge_commit
    return details


def _merged_note(task: Task) -> str:
    if task.status == TaskStatus.DONE and task.merge_commit:
        return f" (merged as {task.merge_commit[:12]})"
    return ""


def _refuse(problems: list[GraphProblem], existing: dict[str, list[str]]) -> None:
    """Raise for the first of a new batch's graph ``problems``, listing them all (409 for an
    id that exists already, else 422)."""
    if not problems:
        return
    first = problems[0]
    clash = first.kind == "duplicate" and first.ids[0] in existing
    cls = Conflict if clash else ValidationFailed
    raise cls(
        first.message,
        code="task_exists" if clash else f"plan_{first.kind}",
        details={
            "problems": [
                {"kind": p.kind, "message": p.message, "ids": list(p.ids)} for p in problems
            ]
        },
    )


def _checked(
    tasks: list[Task], known: list[Task]
) -> tuple[list[GraphProblem], dict[str, list[str]], dict[str, TaskStatus]]:
    """A big batch's graph problems against the ``known`` tasks, the known graph (id ->
    dependencies) and every task's status, new ones included (on a worker thread: it reads
    only its arguments)."""
    existing = {t.id: t.depends_on for t in known}
    problems = graph_problems([(t.id, t.depends_on) for t in tasks], existing)
    statuses = {t.id: t.status for t in known}
    statuses.update((t.id, t.status) for t in tasks)
    return problems, existing, statuses
