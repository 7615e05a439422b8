"""Spawning agents: a task already marked ``working`` gets its worktree (created or reused),
a run directory, a rendered command and prompt, and a process started by the executor
(``runs/executor.py``). The run directory is always a new one (``rundirs.py``).

The agent is recorded (``starting``) before its process is started, so a daemon that dies
in between finds it on restart (``reattaching.py``). A spawn that fails for any reason
(a ``GriddError`` or an ``OSError``: the worktree gone, no file descriptors left, a command
that cannot run) settles the agent as exited and fails the attempt with its reason: the task
goes back to ``ready`` after a backoff, or to ``failed`` once its attempts are used up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path

from gridd.adapters.base import Adapter
from gridd.adapters.registry import get_adapter
from gridd.errors import GriddError, StoreError
from gridd.faults import crash_point
from gridd.git.prepared import PreparedWorktrees
from gridd.git.private import PrivateRepos
from gridd.git.worktrees import Worktree, Worktrees
from gridd.ids import task_branch
from gridd.lifecycle import create_agent, move_agent, move_task
from gridd.model import Agent, AgentStatus, Task, TaskStatus, utcnow
from gridd.plan import RATE_LIMIT_RESET
from gridd.pool.context import PoolContext
from gridd.pool.monitoring import Monitor
from gridd.pool.prompts import continuation_prompt, feedback_prompt, render_command
from gridd.pool.rundirs import new_run
from gridd.runs.egress import proxy_env
from gridd.runs.executor import Launch, StartAbandoned, running_fields
from gridd.runs.sandbox import sandbox_for
from gridd.runs.watch import RunWatch

log = logging.getLogger(__name__)


class SpawnFailed(GriddError):
    """The executor could not start a recorded agent (the agent is settled as exited)."""

    code = "spawn_failed"

    def __init__(
        self, message: str, *, agent_id: str, counted: bool, details: dict[str, object]
    ) -> None:
        super().__init__(message, details=details)
        self.agent_id = agent_id
        self.counted = counted


#: The code of an executor's refusal that means "not started yet", not a failure (a
#: Kubernetes namespace's quota: ``runs/kubernetes.py`` ``QuotaExceeded``).
NOT_STARTED = "quota_exceeded"


def describe(exc: OSError) -> str:
    """An OSError as a person reads it: its type and its message (with the path)."""
    return f"{type(exc).__name__}: {exc}"


#: Called before the first agent of a task from an external source starts; False means
#: someone else owns the task (e.g. a lost beads claim).
Claimer = Callable[[Task], Awaitable[bool]]


async def _ask(claimer: Claimer, task: Task) -> bool | Exception:
    """The claim's answer: True (ours), False (someone else's) or why bd could not say."""
    try:
        return await claimer(task)
    except Exception as exc:
        return exc


async def _unaskable(task: Task) -> bool | Exception:
    """The answer for a claim no configured source can be asked about."""
    return GriddError(
        f"no {task.source} source is configured any more: cannot check the claim on {task.id}",
        code="claim_unaskable",
    )


class Spawner:
    def __init__(
        self,
        ctx: PoolContext,
        *,
        worktrees: Worktrees,
        private: PrivateRepos,
        monitor: Monitor,
        environ: Mapping[str, str],
        prepared: PreparedWorktrees | None = None,
    ) -> None:
        self.ctx = ctx
        self.worktrees = worktrees
        #: A ``workspace`` sandbox's run gets a repository of its own in its worktree.
        self.private = private
        self.monitor = monitor
        self.environ = dict(environ)
        self.claimers: dict[str, Claimer] = {}
        #: Worktrees made ahead (``git.prepared``), taken first.
        self.prepared = prepared
        #: Task id -> the attempts it had before a start the disk paused, while that start
        #: had counted one: taken back at its next start if the disk refused to record it
        #: then (``_start_paused``), so the count in memory is never one too many.
        self._taken_back: dict[str, int] = {}

    async def start(self, task_id: str, profile_name: str) -> None:
        """Spawn an agent for a task already marked ``working``. Failures retry later."""
        self.ctx.roster.starting.add(task_id)
        try:
            await self._start(task_id, profile_name)
        except Exception as exc:  # a bug still fails the attempt: never left `working`
            self._failed(task_id, exc)
        finally:
            self.ctx.roster.starting.discard(task_id)
            self.ctx.state.flush()

    def _failed(self, task_id: str, exc: Exception) -> None:
        """A start failed with ``exc``: the attempt fails, unless the disk under ``.grid/``
        refused a write (then the start is paused, and no attempt is spent on it)."""
        agent_id, counted = None, False
        if isinstance(exc, SpawnFailed):
            message, agent_id, counted = exc.message, exc.agent_id, exc.counted
        elif isinstance(exc, GriddError):
            message = exc.message
        elif isinstance(exc, OSError):
            message = describe(exc)
        else:
            log.exception("starting task %s failed unexpectedly", task_id, exc_info=exc)
            message = f"{type(exc).__name__}: {exc}"
        if NOT_STARTED in (getattr(exc, "code", None), getattr(exc.__cause__, "code", None)):
            self._start_failed(task_id, message, agent_id=agent_id, counted=counted, spent=False)
            return
        fault = self.ctx.disk.note(exc)
        if fault is None:
            self._start_failed(task_id, message, agent_id=agent_id, counted=counted)
            return
        try:
            self._start_paused(task_id, message, fault, agent_id=agent_id, counted=counted)
        except GriddError as again:  # the store is on that disk too: nothing was counted
            log.error("could not record the paused start of %s: %s", task_id, again.message)

    async def _start(self, task_id: str, profile_name: str) -> None:
        profile = self.ctx.profiles.get(profile_name)
        if profile is None:
            raise GriddError(f"unknown agent profile {profile_name!r}", code="unknown_profile")
        first = self.ctx.state.tasks[task_id]
        adapter = get_adapter(profile.adapter, options=profile.adapter_options)
        session = self.ctx.state.session
        base_branch = session.feature_branch if session.started else None
        making = (self.prepared or self.worktrees).create(
            task_id, base_branch, known_base=first.base_commit if first.branch else None
        )
        claimer = self.claimers.get(first.source)
        claim: asyncio.Task[bool | Exception] | None = None
        if claimer is not None and first.attempts == 0:
            # The claim runs while the worktree is made and the agent starts: process starts
            # that need nothing of each other. The agent's finish waits for its answer, and a
            # claim lost stops the agent before any of its work is committed (``_own``).
            claim = self.ctx.background.spawn(f"claim:{task_id}", _ask(claimer, first))
            self.ctx.roster.claims[task_id] = asyncio.get_running_loop().create_future()
        try:
            await self._spawn(task_id, profile_name, adapter, making=making, claim=claim)
        except Exception:
            # A start that failed for a task that turns out not to be ours is no attempt;
            # what went wrong is still reported (``start``), the task no longer working.
            if claim is not None and (outcome := await claim) is not True:
                self._not_ours(task_id, outcome)
            raise
        finally:
            gate = self.ctx.roster.claims.pop(task_id, None) if claim is not None else None
            if gate is not None and not gate.done():
                gate.set_result(None)

    async def _own(
        self, task_id: str, agent_id: str, worktree: Worktree, claim: asyncio.Task[bool | Exception]
    ) -> None:
        """The claim's answer for an agent already started: a claim lost (or unanswered)
        stops it at once, and its finish commits nothing and removes its worktree."""
        outcome = await claim
        if outcome is True:
            agent = self.ctx.state.agents.get(agent_id)
            if agent is not None and agent.claim_pending:
                self.ctx.state.update_agent(agent_id, claim_pending=False)
            return
        self.ctx.roster.disowned[task_id] = worktree
        self._not_ours(task_id, outcome)
        why = "claim unanswered" if isinstance(outcome, Exception) else "claim lost"
        self.monitor.stopper.request_stop(agent_id, why, force=True)

    def recheck_claim(self, agent: Agent, *, after: Awaitable[None]) -> None:
        """An earlier daemon started this run while its task's claim was in flight and died
        before the answer: ask again (a claim bd already granted is granted again) before the
        run is finished, and treat a loss as ``_own`` does, once ``after`` (the run's
        reattach) is done: a stop asked for before it would find no run to stop.

        A claim that cannot be asked any more (the task's source is no longer configured)
        is an unanswered one: the run's work is set aside, never committed unchecked. A
        task gone meanwhile leaves no claim to answer (its run's finish commits nothing)."""
        task = self.ctx.state.tasks.get(agent.task_id)
        if task is None:
            self.ctx.state.update_agent(agent.id, claim_pending=False)
            return
        claimer = self.claimers.get(task.source)
        # The task's branch and base as its record says; a first attempt put back by an
        # unanswered claim has forgotten them: its own branch name, and no base (what the
        # run committed is then kept rather than compared).
        branch = task.branch or task_branch(task.id)
        worktree = Worktree(task.id, Path(agent.worktree_path), branch, task.base_commit or "")
        asking = _ask(claimer, task) if claimer is not None else _unaskable(task)
        claim = self.ctx.background.spawn(f"claim:{task.id}", asking)
        gate = self.ctx.roster.claims[task.id] = asyncio.get_running_loop().create_future()

        async def answered() -> None:
            try:
                await after
                await self._own(task.id, agent.id, worktree, claim)
            finally:
                self.ctx.roster.claims.pop(task.id, None)
                if not gate.done():
                    gate.set_result(None)
                self.ctx.state.flush()

        self.ctx.background.spawn(f"claim-recheck:{task.id}", answered())

    def _not_ours(self, task_id: str, outcome: bool | Exception) -> None:
        """The claim was lost: the task is cancelled. Or bd could not answer: the task waits
        a backoff and starts again as a first attempt (which claims again)."""
        task = self.ctx.state.tasks.get(task_id)
        if task is None or task.status not in (TaskStatus.WORKING, TaskStatus.READY):
            return
        if not isinstance(outcome, Exception):
            move_task(
                self.ctx.state,
                task_id,
                TaskStatus.CANCELLED,
                reason="claim lost",
                error="claimed by someone else",
            )
            return
        self.ctx.bus.publish("task.start_failed", {"taskId": task_id, "error": f"claim: {outcome}"})
        first: dict[str, object] = {
            "attempts": 0,
            "sessions": 0,
            "branch": None,
            "base_commit": None,
            "worktree": None,
        }
        if task.status == TaskStatus.READY:
            self.ctx.state.update_task(task_id, **first)
            return
        move_task(
            self.ctx.state,
            task_id,
            TaskStatus.READY,
            reason="claim failed; retrying",
            error=f"claim: {outcome}",
            backoff_until=self.ctx.roster.back_off(task_id, 1),
            **first,
        )

    async def _spawn(
        self,
        task_id: str,
        profile_name: str,
        adapter: Adapter,
        *,
        making: Awaitable[Worktree],
        claim: asyncio.Task[bool | Exception] | None,
    ) -> None:
        # Here, not at start-up: runs.remote (the box executors' side) stays out of an idle daemon.
        from gridd.runs.remote import placement

        profile = self.ctx.profiles[profile_name]
        worktree = await making
        if claim is not None and claim.done() and (outcome := claim.result()) is not True:
            await self.worktrees.discard(worktree)  # answered before anything ran
            self._not_ours(task_id, outcome)
            return
        task = self.ctx.state.tasks.get(task_id)
        if task is None or task.status != TaskStatus.WORKING:
            return  # stopped or cancelled while the worktree was being made
        continuing = task.sessions > 0
        so_far = task.attempts
        owed = self._taken_back.pop(task_id, None)
        if owed is not None and so_far == owed + 1:
            so_far = owed  # a paused start's attempt the disk did not let us take back
        attempt = so_far if continuing else so_far + 1
        session_number = task.sessions + 1
        if continuing:
            resumed = task.error == RATE_LIMIT_RESET
            prompt = continuation_prompt(task, session_number, rate_limited=resumed)
        elif task.feedback:
            prompt = feedback_prompt(task)
        else:
            prompt = task.prompt or task.title
        agent_id, run_dir = new_run(self.ctx.state.store, self.ctx.workspace.runs_dir, profile_name)
        argv = render_command(
            profile.command,
            {"prompt": prompt, "task_id": task.id, "worktree": str(worktree.path)},
        )
        argv += adapter.extra_args(argv)
        resumes = continuing or bool(task.feedback)  # the same conversation, sent back
        previous_session = self._previous_session_id(task.id) if resumes else None
        if previous_session:
            argv = adapter.resume_args(argv, previous_session)
        env = {
            **self.environ,
            **profile.env,
            "GRID_TASK_ID": task.id,
            "GRID_AGENT_ID": agent_id,
            "GRID_WORKSPACE": str(self.ctx.workspace.root),
            "GRID_SOCKET": str(self.ctx.workspace.socket_path),
            "GRID_HEARTBEAT": str(run_dir / "heartbeat.ndjson"),
            "GRID_ATTEMPT": str(attempt),
            "GRID_SESSION": str(session_number),
        }
        failure = self._previous_failure_file(task.id)
        if failure is not None:
            env["GRID_PREVIOUS_FAILURE"] = str(failure)
        sandbox = sandbox_for(
            profile.sandbox,
            adapter=profile.adapter,
            worktree=worktree.path,
            run_dir=run_dir,
            grid_dir=self.ctx.workspace.grid_dir,
            home=Path(env.get("HOME") or Path.home()),  # the profile's env may set it
        )
        if sandbox is not None:
            env |= {"TMPDIR": sandbox.tmpdir, "TMP": sandbox.tmpdir, "TEMP": sandbox.tmpdir}
        if sandbox is not None and sandbox.network == "allowlist":
            # Its one way out; its port goes into the record, for a restarted daemon.
            port = await self.ctx.egress.open(agent_id, sandbox.hosts)
            sandbox = replace(sandbox, proxy_port=port)
            env |= proxy_env(port)
        self.ctx.state.update_task(
            task_id,
            attempts=attempt,
            sessions=session_number,
            branch=worktree.branch,
            base_commit=worktree.base,
            worktree=str(worktree.path),
            error=None,
        )
        executor = profile.executor or self.ctx.settings.executors.default
        agent = Agent(
            id=agent_id,
            task_id=task_id,
            profile=profile_name,
            worktree_path=str(worktree.path),
            attempt=attempt,
            run_dir=str(run_dir),
            adapter=profile.adapter,
            session_number=session_number,
            claim_pending=claim is not None and not claim.done(),
            sandbox=sandbox.wire() if sandbox is not None else None,
            executor=placement(executor, self.ctx.workspace.root, run_dir),
        )
        create_agent(self.ctx.state, agent)  # the intent: found by a restart if we die now
        await self.ctx.state.store.durable()  # (a locked database: no run before its record)
        crash_point(self.ctx.settings, "spawn.recorded")
        try:
            if sandbox is not None and sandbox.mode == "workspace" and executor == "local":
                await self.private.make(worktree.path, agent_id=agent_id)
                crash_point(self.ctx.settings, "spawn.private_repo")
            else:  # an earlier run's repository, left by a daemon that died: its work first
                await self.private.reclaim(worktree.path)
            handle = await self.ctx.executor.spawn(
                Launch(
                    run_dir=run_dir,
                    argv=argv,
                    cwd=worktree.path,
                    env=env,
                    stdin=profile.stdin,
                    sandbox=sandbox,
                    executor=executor,
                    box=profile.box_options(executor),
                )
            )
        except (GriddError, OSError) as exc:
            self.ctx.egress.close(agent_id)
            await self._give_back(worktree.path)
            if isinstance(exc, StartAbandoned) and self._stopped_first(
                agent_id, counted=not continuing
            ):
                return
            message = exc.message if isinstance(exc, GriddError) else describe(exc)
            move_agent(
                self.ctx.state,
                agent_id,
                AgentStatus.EXITED,
                reason="spawn failed",
                ended_at=utcnow(),
                error=message,
            )
            # The attempt was counted above: undo the session, so a retry starts it afresh.
            self.ctx.state.update_task(task_id, sessions=session_number - 1)
            raise SpawnFailed(
                f"could not start the agent: {message}",
                agent_id=agent_id,
                counted=not continuing,
                details={"agentId": agent_id, "runDir": str(run_dir)},
            ) from exc
        crash_point(self.ctx.settings, "spawn.started")
        self.ctx.roster.handles[agent_id] = handle
        self.ctx.roster.runs[agent_id] = RunWatch(run_dir, adapter)
        self.ctx.roster.started_mono[agent_id] = time.monotonic()
        try:
            move_agent(
                self.ctx.state,
                agent_id,
                AgentStatus.RUNNING,
                reason="spawned",
                **running_fields(agent, handle),
            )
            self.ctx.bus.publish(
                "agent.spawned",
                {
                    "agentId": agent_id,
                    "taskId": task_id,
                    "worktree": str(worktree.path),
                    "pid": handle.pid,
                    "profile": profile_name,
                    "attempt": attempt,
                    "session": session_number,
                },
            )
        except StoreError as exc:
            # Its process runs: it is watched whatever the disk says. Its record stays
            # ``starting`` (a restart adopts such a run from its directory) until the
            # monitor records its exit, once writes work again; the start is not failed.
            self.ctx.disk.note(exc)
            log.warning(
                "agent %s of task %s runs, but its start could not be recorded (%s): it is"
                " watched, and its exit will be",
                agent_id,
                task_id,
                exc.message,
            )
        self.ctx.state.touch()
        self.monitor.spawn(agent_id)
        if sandbox is not None and sandbox.mode == "workspace" and executor == "local":
            self.ctx.background.spawn("private-spare", self.private.prepare())
        if claim is not None:
            await self._own(task_id, agent_id, worktree, claim)
        opening = adapter.initial_input(prompt)
        if opening and profile.stdin == "pipe" and handle.exit_status() is None:
            try:
                handle.write_stdin(opening)
            except (GriddError, OSError) as exc:
                # It runs, and is watched: it cannot be told its task, so it is stopped.
                message = exc.message if isinstance(exc, GriddError) else describe(exc)
                reason = f"could not send the agent its prompt: {message}"
                self.ctx.bus.publish("agent.warning", {"agentId": agent_id, "warning": reason})
                self.monitor.stopper.request_stop(agent_id, reason, force=True)

    def _stopped_first(self, agent_id: str, *, counted: bool) -> bool:
        """A stop (a cancel, a stop, a kill) came while the agent was starting, and the
        executor gave its start up (``Executor.abandon_start``): the run never started, so
        it is settled as stopped (``agent.stopped``), its attempt and session not spent, and
        its task stays where that request put it. False when the task still wants a run
        (the stop was for a timeout): then it is a start that failed, as any other."""
        agent = self.ctx.state.agents[agent_id]
        task = self.ctx.state.tasks.get(agent.task_id)
        if task is not None and task.status == TaskStatus.WORKING and agent.intent is None:
            return False
        reason = agent.stop_reason or (task.status_reason if task else None) or "stopped"
        move_agent(
            self.ctx.state,
            agent_id,
            AgentStatus.EXITED,
            reason="stopped before it started",
            ended_at=utcnow(),
            stop_reason=reason,
        )
        if task is not None:
            taken_back = {"attempts": task.attempts - 1} if counted else {}
            self.ctx.state.update_task(task.id, sessions=task.sessions - 1, **taken_back)
        self.ctx.bus.publish(
            "agent.stopped",
            {
                "agentId": agent_id,
                "taskId": agent.task_id,
                "reason": reason,
                "exitCode": None,
                "committedWork": False,
            },
        )
        return True

    async def _give_back(self, path: Path) -> None:
        """The worktree a plain one again after a start that failed: nothing ran in the
        repository made for the run (a spawn given up on is fenced first)."""
        try:
            await self.private.reclaim(path)
        except (GriddError, OSError) as exc:  # the next start, or recovery, tries again
            log.warning("the run's own repository in %s is left for later: %s", path, exc)

    def _start_failed(
        self,
        task_id: str,
        message: str,
        *,
        agent_id: str | None = None,
        counted: bool = False,
        spent: bool = True,
    ) -> None:
        """The attempt failed before its agent ran: say why (``task.start_failed``, the
        task's ``error``), and retry after a backoff, or fail the task once its attempts are
        used up. ``counted``: the attempt was already added to the task's count. Not
        ``spent``: the executor's engine refused the run for now (a namespace's quota is
        full): it never started, so no attempt is spent and the task only waits."""
        task = self.ctx.state.tasks.get(task_id)
        if task is None:
            return
        log.warning("could not start task %s: %s", task_id, message)
        if spent:
            attempts = task.attempts if counted else task.attempts + 1
        else:
            attempts = task.attempts - 1 if counted else task.attempts
        self._tell_failed(task_id, message, attempts, counted=spent, agent_id=agent_id)
        if task.status != TaskStatus.WORKING:
            return
        if spent and attempts >= task.max_attempts:
            move_task(
                self.ctx.state,
                task_id,
                TaskStatus.FAILED,
                reason="could not start",
                attempts=attempts,
                error=message,
            )
        else:
            until = self.ctx.roster.back_off(task_id, max(attempts, 1))
            move_task(
                self.ctx.state,
                task_id,
                TaskStatus.READY,
                reason="could not start; retrying" if spent else "not started: no room yet",
                attempts=attempts,
                error=message,
                backoff_until=until,
            )

    def _start_paused(
        self,
        task_id: str,
        message: str,
        fault: str,
        *,
        agent_id: str | None,
        counted: bool,
    ) -> None:
        """The start met a disk that refuses writes: not the task's failure, so not its
        attempt (``counted``: already added, taken back). A ``working`` task stays so and
        starts again once the disk takes writes; the scheduler starts nothing meanwhile."""
        task = self.ctx.state.tasks.get(task_id)
        if task is None:
            return
        log.warning("could not start task %s: %s; not counted, as %s", task_id, message, fault)
        attempts = task.attempts - 1 if counted else task.attempts
        if counted:  # in memory first: the writes below may meet the same disk
            self._taken_back[task_id] = attempts
        self._tell_failed(task_id, message, attempts, counted=False, agent_id=agent_id)
        if task.status == TaskStatus.WORKING:
            self.ctx.state.update_task(task_id, attempts=attempts, error=f"start paused: {fault}")

    def _tell_failed(
        self, task_id: str, message: str, attempts: int, *, counted: bool, agent_id: str | None
    ) -> None:
        event: dict[str, object] = {
            "taskId": task_id,
            "error": message,
            "attempt": attempts,
            "counted": counted,
        }
        if agent_id is not None:
            event["agentId"] = agent_id
        self.ctx.bus.publish("task.start_failed", event)

    def _task_agents(self, task_id: str) -> list[Agent]:
        agents = [a for a in self.ctx.state.agents.values() if a.task_id == task_id]
        return sorted(agents, key=lambda a: a.started_at)

    def _previous_session_id(self, task_id: str) -> str | None:
        for agent in reversed(self._task_agents(task_id)):
            if agent.session_id:
                return agent.session_id
        return None

    def _previous_failure_file(self, task_id: str) -> Path | None:
        for agent in reversed(self._task_agents(task_id)):
            path = Path(agent.run_dir) / "failure.md"
            if path.exists():
                return path
        return None
