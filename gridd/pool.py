"""The agent pool: start an agent for a task, watch it, and stop it.

Starting means: the task's worktree (created or reused), a run directory, and a detached
shim that runs the agent there (see ``agents/shim.py``). Watching means: index its output
into ``agent.output`` events, read its heartbeats, let its adapter turn both into activity,
questions, cost and results, and judge its health (launch failure, stall). Finishing is
``finish.py``'s job. An agent's identity is (pid, create time), for it and for its shim.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path

from gridd.adapters import base
from gridd.adapters.registry import get_adapter
from gridd.agents.output import OutputLog
from gridd.agents.process import AgentProcess, ExitStatus, ShimStarter
from gridd.agents.wakeups import Wakeup, Wakeups
from gridd.agents.watch import Poll, RunWatch
from gridd.background import Background
from gridd.errors import Conflict, GriddError, StoreError
from gridd.events import EventBus
from gridd.git.prepared import PreparedWorktrees
from gridd.lifecycle import move_agent, move_task
from gridd.liveness import LAUNCH_HINT, Limits, Verdict, assess, next_change
from gridd.model import (
    TERMINAL_TASK_STATUSES,
    Agent,
    AgentStatus,
    Question,
    Task,
    TaskStatus,
    utcnow,
)
from gridd.plan import RATE_LIMIT_RESET
from gridd.questions import QuestionBook
from gridd.settings import AgentProfile, Settings
from gridd.state import GridState
from gridd.workspace import Workspace
from gridd.worktrees import Worktrees

log = logging.getLogger(__name__)

#: A look at a run indexes at most this many chunks (``OutputLog.poll``); a full look
#: means more may be waiting, so the watcher looks again at once instead of sleeping.
MAX_CHUNKS_PER_LOOK = 16
#: Where nothing reports the shim's death (no pidfd) the watcher asks the OS this often.
LIVENESS_SECONDS = 0.5
#: A state database that cannot be written: retry watching after this (doubling, capped).
STORE_RETRY_SECONDS = 0.5
STORE_RETRY_MAX_SECONDS = 10.0
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


class AgentPool:
    def __init__(
        self,
        *,
        workspace: Workspace,
        settings: Settings,
        state: GridState,
        bus: EventBus,
        worktrees: Worktrees,
        background: Background,
        questions: QuestionBook,
        environ: Mapping[str, str],
    ) -> None:
        self.ws = workspace
        self.settings = settings
        self.profiles: dict[str, AgentProfile] = settings.profiles()
        self.state = state
        self.bus = bus
        self.worktrees = worktrees
        self.background = background
        self.questions = questions
        self.environ = dict(environ)
        self.handles: dict[str, AgentProcess] = {}
        self.shims = ShimStarter(workspace.runs_dir / "spare-shim.log")
        self.runs: dict[str, RunWatch] = {}
        watch = settings.watch
        #: What wakes the watchers: file notifications, the shims' exits, a safety-net sweep.
        self.wakeups = Wakeups(
            notify=watch.notify,
            sweep_seconds=watch.sweep_seconds,
            fallback_seconds=watch.fallback_seconds,
        )
        self._sweeping = False
        self.started_mono: dict[str, float] = {}
        self.starting: set[str] = set()
        #: Task ids whose agent has exited and is being finished (commit, new status): until
        #: that is done the task must not get another agent.
        self.finishing: set[str] = set()
        self.not_before: dict[str, float] = {}
        #: Agents with a stop in flight in this daemon (True: a kill). The status says
        #: ``stopping`` from an earlier daemon too; this says whether anyone acts on it.
        self.stops: dict[str, bool] = {}
        #: Called before the first agent of a task from an external source starts;
        #: False means someone else owns the task (e.g. a lost beads claim).
        self.claimers: dict[str, Callable[[Task], Awaitable[bool]]] = {}
        self._restore_backoffs()
        #: Set by the composition root: worktrees made ahead (``git.prepared``), taken first.
        self.prepared: PreparedWorktrees | None = None
        #: Set by the composition root: finishes an agent run (``finish.Finisher.finish``).
        self.on_exit: Callable[[str, ExitStatus, RunWatch], Awaitable[None]] | None = None

    # -- starting ----------------------------------------------------------------------------

    def backoff(self, attempts: int) -> float:
        sched = self.settings.scheduler
        return float(
            min(sched.backoff_max_seconds, sched.backoff_seconds * 2 ** max(0, attempts - 1))
        )

    def back_off(self, task_id: str, attempts: int) -> datetime:
        """Hold the task back after a failure: a monotonic deadline for the scheduler, and
        the wall-clock deadline returned to be persisted with the task (``backoff_until``)."""
        delay = self.backoff(attempts)
        self.not_before[task_id] = time.monotonic() + delay
        return utcnow() + timedelta(seconds=delay)

    def _restore_backoffs(self) -> None:
        """A restart keeps every persisted backoff (as the time still left of it)."""
        now_wall, now = utcnow(), time.monotonic()
        for task in self.state.tasks.values():
            if task.backoff_until is not None and task.status not in TERMINAL_TASK_STATUSES:
                left = (task.backoff_until - now_wall).total_seconds()
                if left > 0:
                    self.not_before[task.id] = now + left

    async def start(self, task_id: str, profile_name: str) -> None:
        """Spawn an agent for a task already marked ``working``. Failures retry later."""
        self.starting.add(task_id)
        try:
            await self._start(task_id, profile_name)
        except GriddError as exc:
            self._start_failed(task_id, exc.message)
        except OSError as exc:
            self._start_failed(task_id, f"{type(exc).__name__}: {exc}")
        finally:
            self.starting.discard(task_id)
            self.state.flush()

    async def _start(self, task_id: str, profile_name: str) -> None:
        profile = self.profiles.get(profile_name)
        if profile is None:
            raise GriddError(f"unknown agent profile {profile_name!r}", code="unknown_profile")
        first = self.state.tasks[task_id]
        adapter = get_adapter(profile.adapter, options=profile.adapter_options)
        session = self.state.session
        base_branch = session.feature_branch if session.started else None
        making = (self.prepared or self.worktrees).create(
            task_id, base_branch, known_base=first.base_commit if first.branch else None
        )
        claimer = self.claimers.get(first.source)
        if claimer is not None and first.attempts == 0:
            # Claim while the worktree is made: both are process starts, neither needs the other.
            claimed, made = await asyncio.gather(claimer(first), making, return_exceptions=True)
            if claimed is not True:
                if not isinstance(made, BaseException):
                    await self.worktrees.discard(made)
                if isinstance(claimed, BaseException):
                    # bd could not answer: not an attempt, the claim is tried again later.
                    until = self.back_off(task_id, 1)
                    self.bus.publish(
                        "task.start_failed", {"taskId": task_id, "error": f"claim: {claimed}"}
                    )
                    move_task(
                        self.state,
                        task_id,
                        TaskStatus.READY,
                        reason="claim failed; retrying",
                        error=f"claim: {claimed}",
                        backoff_until=until,
                    )
                    return
                move_task(
                    self.state,
                    task_id,
                    TaskStatus.CANCELLED,
                    reason="claim lost",
                    error="claimed by someone else",
                )
                return
            if isinstance(made, BaseException):
                raise made
            worktree = made
        else:
            worktree = await making
        task = self.state.tasks.get(task_id)
        if task is None or task.status != TaskStatus.WORKING:
            return  # stopped or cancelled while the worktree was being made
        continuing = task.sessions > 0
        attempt = task.attempts if continuing else task.attempts + 1
        session_number = task.sessions + 1
        if continuing:
            resumed = task.error == RATE_LIMIT_RESET
            prompt = continuation_prompt(task, session_number, rate_limited=resumed)
        elif task.feedback:
            prompt = feedback_prompt(task)
        else:
            prompt = task.prompt or task.title
        agent_id = f"{profile_name}-{self.state.store.next_counter('agent')}"
        run_dir = self.ws.runs_dir / agent_id
        argv = render_command(
            profile.command,
            {"prompt": prompt, "task_id": task.id, "worktree": str(worktree.path)},
        )
        argv += adapter.extra_args(argv)
        resumes = continuing or bool(task.feedback)  # the same conversation, sent back
        previous_session = self._previous_session_id(task.id) if resumes else None
        if previous_session and profile.adapter == "claude":
            argv += ["--resume", previous_session]
        env = {
            **self.environ,
            **profile.env,
            "GRID_TASK_ID": task.id,
            "GRID_AGENT_ID": agent_id,
            "GRID_WORKSPACE": str(self.ws.root),
            "GRID_SOCKET": str(self.ws.socket_path),
            "GRID_HEARTBEAT": str(run_dir / "heartbeat.ndjson"),
            "GRID_ATTEMPT": str(attempt),
            "GRID_SESSION": str(session_number),
        }
        failure = self._previous_failure_file(task.id)
        if failure is not None:
            env["GRID_PREVIOUS_FAILURE"] = str(failure)
        self.state.update_task(
            task_id,
            attempts=attempt,
            sessions=session_number,
            branch=worktree.branch,
            base_commit=worktree.base,
            worktree=str(worktree.path),
            error=None,
        )
        agent = Agent(
            id=agent_id,
            task_id=task_id,
            profile=profile_name,
            worktree_path=str(worktree.path),
            attempt=attempt,
            run_dir=str(run_dir),
            adapter=profile.adapter,
            session_number=session_number,
        )
        self.state.put_agent(agent)
        try:
            handle = await AgentProcess.spawn(
                run_dir,
                argv=argv,
                cwd=worktree.path,
                env=env,
                stdin=profile.stdin,
                starter=self.shims,
            )
        except GriddError as exc:
            move_agent(
                self.state,
                agent_id,
                AgentStatus.EXITED,
                reason="spawn failed",
                ended_at=utcnow(),
                error=exc.message,
            )
            raise
        opening = adapter.initial_input(prompt)
        if opening and profile.stdin == "pipe" and handle.exit_status() is None:
            handle.write_stdin(opening)
        self.handles[agent_id] = handle
        self.runs[agent_id] = RunWatch(run_dir, adapter)
        self.started_mono[agent_id] = time.monotonic()
        move_agent(
            self.state,
            agent_id,
            AgentStatus.RUNNING,
            reason="spawned",
            pid=handle.pid,
            create_time=handle.create_time,
            shim_pid=handle.shim_pid,
            shim_create_time=handle.shim_create_time,
        )
        self.bus.publish(
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
        self.state.touch()
        self.background.spawn(f"agent:{agent_id}", self._watch(agent_id))

    def _start_failed(self, task_id: str, message: str) -> None:
        task = self.state.tasks.get(task_id)
        if task is None:
            return
        log.warning("could not start task %s: %s", task_id, message)
        attempts = task.attempts + 1
        self.bus.publish("task.start_failed", {"taskId": task_id, "error": message})
        if task.status != TaskStatus.WORKING:
            return
        if attempts >= task.max_attempts:
            move_task(
                self.state,
                task_id,
                TaskStatus.FAILED,
                reason="could not start",
                attempts=attempts,
                error=message,
            )
        else:
            until = self.back_off(task_id, attempts)
            move_task(
                self.state,
                task_id,
                TaskStatus.READY,
                reason="could not start; retrying",
                attempts=attempts,
                error=message,
                backoff_until=until,
            )

    def _task_agents(self, task_id: str) -> list[Agent]:
        agents = [a for a in self.state.agents.values() if a.task_id == task_id]
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

    # -- reattaching after a restart -------------------------------------------------------------

    def reattach(self, agent: Agent) -> None:
        """Resume watching an agent started by an earlier daemon (its shim outlived us)."""
        handle = AgentProcess(
            Path(agent.run_dir),
            agent.pid,
            agent.create_time,
            shim_pid=agent.shim_pid,
            shim_create_time=agent.shim_create_time,
        )
        if agent.pid is None:
            # That daemon died while the shim was starting: the shim may well run the agent.
            adopted = AgentProcess.adopt(
                Path(agent.run_dir), not_before=agent.started_at.timestamp()
            )
            if adopted is not None:
                handle = adopted
                agent = move_agent(
                    self.state,
                    agent.id,
                    AgentStatus.RUNNING,
                    reason="adopted after a restart",
                    pid=handle.pid,
                    create_time=handle.create_time,
                    shim_pid=handle.shim_pid,
                    shim_create_time=handle.shim_create_time,
                )
        profile = self.profiles.get(agent.profile)
        try:
            adapter = get_adapter(agent.adapter, options=profile.adapter_options if profile else {})
        except GriddError:
            adapter = get_adapter("heartbeat")
        run = RunWatch(Path(agent.run_dir), adapter, heartbeat_offset=agent.heartbeat_offset)
        if adapter.ends_on_result:
            # It may have said its final word before we died: know it, to end the run.
            run.replay(agent.output_seq)
        self._resume_output(agent, run)
        run.last_life = time.monotonic()  # we cannot know; don't call it a launch failure
        self.handles[agent.id] = handle
        self.runs[agent.id] = run
        elapsed = (utcnow() - agent.started_at).total_seconds()
        self.started_mono[agent.id] = time.monotonic() - max(0.0, elapsed)
        self.bus.publish(
            "agent.reattached",
            {
                "agentId": agent.id,
                "taskId": agent.task_id,
                "pid": agent.pid,
                "alive": handle.alive(),
                "exited": handle.exit_status() is not None,
            },
        )
        self.background.spawn(f"agent:{agent.id}", self._watch(agent.id))

    def _resume_output(self, agent: Agent, run: RunWatch) -> None:
        """Line the output index up with what was published (``agent.output_seq``)."""
        published, indexed = agent.output_seq, run.output.seq
        if indexed > published:
            # Indexed, then the daemon died before publishing: they go out first.
            run.pending = run.output.read_since(published, limit=indexed - published)
        elif indexed < published:
            # The index lost records that were published: keep their numbers taken, so no
            # seq is ever given to two different chunks.
            run.output.skip_to(published)
            self.bus.publish(
                "agent.warning",
                {
                    "agentId": agent.id,
                    "warning": f"output index {run.output.idx_path} held {indexed} of the"
                    f" {published} chunks already published; output from there on may repeat",
                },
            )

    # -- watching ------------------------------------------------------------------------------

    def _wakeup(self, agent_id: str, handle: AgentProcess, run: RunWatch) -> Wakeup:
        """The watcher's alarm clock (``agents/wakeups.py``); the sweep starts with the first."""
        if not self._sweeping:
            self._sweeping = True
            self.wakeups.start()
            self.background.supervise("agent-wakeups", self.wakeups.run, core=True)
        return self.wakeups.watch(
            handle.run_dir,
            unread=run.unread,
            shim_pid=handle.shim_pid if handle.shim_create_time is not None else None,
            shim_alive=handle.shim_alive,
        )

    async def _watch(self, agent_id: str) -> None:
        """Watch one agent until it has exited and been finished. A state database that
        cannot be written (a full or read-only disk) pauses the watching, never ends it:
        the agent's output stays in its run files and the watch resumes once writes work."""
        pause = STORE_RETRY_SECONDS
        while True:
            try:
                await self._watch_once(agent_id)
                return
            except StoreError as exc:
                log.error("agent %s: %s; watching again in %.0fs", agent_id, exc.message, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, STORE_RETRY_MAX_SECONDS)

    async def _watch_once(self, agent_id: str) -> None:
        handle, run = self.handles[agent_id], self.runs[agent_id]
        wake = self._wakeup(agent_id, handle, run)
        try:
            await self._watch_run(agent_id, handle, run, wake)
        finally:
            self.wakeups.unwatch(wake)

    async def _watch_run(
        self, agent_id: str, handle: AgentProcess, run: RunWatch, wake: Wakeup
    ) -> None:
        """Look at the run each time something happened to it (see ``Wakeups``): new output
        or heartbeats, ``exit.json``, the shim's death, or a health deadline."""
        next_liveness = 0.0
        while True:
            wake.clear()  # before looking: a write from here on wakes us again
            status = handle.exit_status()
            polled = run.poll(final=status is not None)
            self._apply(agent_id, run, polled)
            now = time.monotonic()
            # Asking the OS whether the shim lives costs far more than reading two files:
            # exit.json is the normal way out and a pidfd reports the shim's death, so this
            # is only the safety net where no pidfd watches it (or the agent is orphaned).
            ask_os = wake.shim_gone or (not wake.shim_watched and now >= next_liveness)
            if status is None and ask_os and not handle.shim_alive():
                # The shim writes exit.json just before it exits: look once more.
                status = handle.exit_status() or self._orphaned(agent_id, handle, run)
            if status is None and now >= next_liveness:
                next_liveness = now + LIVENESS_SECONDS
            if status is not None:
                while True:
                    rest = run.poll(final=True)
                    if not rest.chunks and not rest.beats:
                        break
                    self._apply(agent_id, run, rest)
                if self.on_exit is not None:
                    await self.on_exit(agent_id, status, run)
                return
            self._check_health(agent_id, run)
            if len(polled.chunks) >= MAX_CHUNKS_PER_LOOK:
                await asyncio.sleep(0)  # more may be waiting: let others run, then go on
                continue
            await wake.wait(self._sleep_for(agent_id, run, wake))

    def _sleep_for(self, agent_id: str, run: RunWatch, wake: Wakeup) -> float | None:
        """How long a watcher may sleep when nothing wakes it: until its next health verdict,
        or the liveness check where nothing reports the shim's death."""
        agent = self.state.agents[agent_id]
        limits = self._limits(agent)
        started = self.started_mono.get(agent_id, time.monotonic())
        health_due = next_change(
            now=time.monotonic(), started=started, last_life=run.last_life, limits=limits
        )
        if agent.status not in (AgentStatus.RUNNING, AgentStatus.STARTING):
            # Stopping, or waiting for a human: silence is expected. Look now and then all
            # the same: an answer makes it running again, and its clock starts anew.
            health_due = self.wakeups.sweep_seconds
        liveness = None if wake.shim_watched and not run.orphaned else LIVENESS_SECONDS
        waits = [w for w in (health_due, liveness) if w is not None]
        return min(waits) if waits else None

    def _orphaned(self, agent_id: str, handle: AgentProcess, run: RunWatch) -> ExitStatus | None:
        """The shim is gone without a readable exit record. While the agent itself still
        runs (its output still reaches the log) it is watched on; once it is gone too, its
        exit status is unknown and that is the reason it failed."""
        exit_file = handle.run_dir / "exit.json"
        if exit_file.exists():
            reason = f"{exit_file} is unreadable; the agent's exit status is unknown"
        else:
            reason = "the agent's supervisor died; its exit status is unknown"
        if handle.group_alive():
            if not run.orphaned:
                run.orphaned = True
                self.bus.publish(
                    "agent.warning",
                    {"agentId": agent_id, "warning": f"{reason}; watching it until it exits"},
                )
            return None
        return ExitStatus(None, None, reason)

    def _apply(self, agent_id: str, run: RunWatch, polled: Poll) -> None:
        agent = self.state.agents[agent_id]
        if polled.chunks:
            last = next(
                (ln for ln in reversed(polled.chunks[-1].text.splitlines()) if ln.strip()), ""
            )
            # The chunks' events and the agent's published position commit together: a
            # daemon killed after indexing them publishes exactly the rest on restart.
            # (Subscribers only see the events after this synchronous block has committed.)
            with self.state.store.transaction():
                for chunk in polled.chunks:
                    self.bus.publish(
                        "agent.output",
                        {"agentId": agent_id, "chunk": chunk.text, "seq": chunk.seq},
                    )
                self.state.update_agent(
                    agent_id,
                    output_seq=polled.chunks[-1].seq,
                    last_output=last[-300:] or agent.last_output,
                )
        changes: dict[str, object] = {}
        if polled.beats:
            beat = polled.beats[-1]
            changes.update(
                last_heartbeat=utcnow(),
                heartbeat_offset=run.heartbeats.offset,
                activity=beat.label or beat.status,
                message=beat.message,
            )
        for warning in polled.warnings:
            self.bus.publish("agent.warning", {"agentId": agent_id, "warning": warning})
        for sig in polled.signals:
            self._signal(agent, run, sig, changes)
        if polled.life and agent.stalled:
            changes["stalled"] = False
            self.bus.publish("agent.recovered", {"agentId": agent_id, "taskId": agent.task_id})
        if changes:
            # Heartbeats, costs and session ids are persisted; output position is derivable.
            persist = bool(polled.beats) or any(
                k in changes for k in ("cost_usd", "session_id", "result", "stalled", "model")
            )
            self.state.update_agent(agent_id, persist=persist, **changes)
        if run.adapter.ends_on_result and not run.session_ended and run.adapter.idle():
            self._end_conversation(agent_id, run)

    def _signal(
        self, agent: Agent, run: RunWatch, sig: base.Signal, changes: dict[str, object]
    ) -> None:
        if isinstance(sig, base.Activity):
            changes.update(activity=sig.label, message=sig.message)
        elif isinstance(sig, base.Ask):
            auto = run.adapter.auto_answer(sig)
            line: str | None = None
            if auto is not None:
                try:
                    # Encoded like a human's answer: aider reads "y", not the label "yes".
                    line = run.adapter.encode_answer(sig, auto)
                    self.handles[agent.id].write_stdin(line)
                except GriddError as exc:  # e.g. stdin = "null": a human must answer
                    line = None
                    warning = f"could not answer automatically ({exc.message}); asking a human"
                    self.bus.publish("agent.warning", {"agentId": agent.id, "warning": warning})
            if line is not None:
                self.bus.publish(
                    "agent.auto_answered",
                    {
                        "agentId": agent.id,
                        "taskId": agent.task_id,
                        "question": sig.question,
                        "answer": auto,
                    },
                )
            else:
                self.questions.ask(self.state.agents[agent.id], sig)
        elif isinstance(sig, base.Cost):
            changes["cost_usd"] = sig.usd
        elif isinstance(sig, base.SessionId):
            changes["session_id"] = sig.value
        elif isinstance(sig, base.Result):
            changes.update(result=sig.text[-2000:], current_tool=None)
        elif isinstance(sig, base.RateLimited):
            if not run.rate_limit_published:  # one event per park, however often it is said
                run.rate_limit_published = True
                self.bus.publish(
                    "agent.rate_limited",
                    {
                        "agentId": agent.id,
                        "taskId": agent.task_id,
                        "message": sig.message,
                        "resetsAt": sig.resets_at,
                        "limitType": sig.limit_type,
                        "source": sig.source,
                    },
                )
        elif isinstance(sig, base.Retrying):
            self.bus.publish(
                "agent.retrying",
                {
                    "agentId": agent.id,
                    "taskId": agent.task_id,
                    "attempt": sig.attempt,
                    "maxRetries": sig.max_retries,
                    "delaySeconds": sig.delay,
                    "error": sig.error,
                    "status": sig.status,
                },
            )
            changes.update(
                activity="retrying", message=f"{sig.error or 'API error'}, attempt {sig.attempt}"
            )
        elif isinstance(sig, base.Nudge):
            self._nudge(agent.id, run, sig.text, why="a continue heartbeat")
        elif isinstance(sig, base.Usage):
            changes.update(input_tokens=sig.input_tokens, output_tokens=sig.output_tokens)
        elif isinstance(sig, base.ModelName):
            changes["model"] = sig.name
        elif isinstance(sig, base.ToolUse):
            changes["current_tool"] = (
                f"{sig.name}: {sig.summary}" if sig.name and sig.summary else sig.name
            )
        elif isinstance(sig, base.Malformed):
            self.bus.publish("agent.warning", {"agentId": agent.id, "warning": sig.message})

    def _limits(self, agent: Agent) -> Limits:
        sched = self.settings.scheduler
        profile = self.profiles.get(agent.profile)
        return Limits(
            launch_grace=(profile and profile.launch_grace_seconds) or sched.launch_grace_seconds,
            stall=(profile and profile.stall_seconds) or sched.stall_seconds,
            stall_kill=sched.stall_kill_seconds,
        )

    def _check_health(self, agent_id: str, run: RunWatch) -> None:
        agent = self.state.agents[agent_id]
        if agent.status not in (AgentStatus.RUNNING, AgentStatus.STARTING):
            return  # stopping, or waiting for a human: silence is expected
        started = self.started_mono.get(agent_id, time.monotonic())
        limits = self._limits(agent)
        verdict = assess(
            now=time.monotonic(), started=started, last_life=run.last_life, limits=limits
        )
        if verdict is Verdict.LAUNCH_FAILED and not run.launch_failed:
            run.launch_failed = True
            reason = f"no output and no heartbeat within {limits.launch_grace:g}s"
            self.bus.publish(
                "agent.launch_failed",
                {
                    "agentId": agent_id,
                    "taskId": agent.task_id,
                    "reason": reason,
                    "hint": LAUNCH_HINT,
                },
            )
            self.request_stop(agent_id, reason, force=True)
        elif verdict is Verdict.STALLED and not agent.stalled:
            self.state.update_agent(agent_id, stalled=True)
            silent = time.monotonic() - (run.last_life or started)
            self.bus.publish(
                "agent.stalled",
                {"agentId": agent_id, "taskId": agent.task_id, "silentSeconds": round(silent, 1)},
            )
            nudge = run.adapter.stall_nudge()
            if nudge is not None and not run.nudged:
                self._nudge(agent_id, run, nudge, why="a stall")
        elif verdict is Verdict.STALL_KILL:
            nudge = run.adapter.stall_nudge()
            if (
                nudge is not None
                and not run.nudged
                and self._nudge(agent_id, run, nudge, why="a stall")
            ):
                run.last_life = time.monotonic()  # a stall kills only after the nudge failed
                return
            self.request_stop(agent_id, f"stalled: silent for over {limits.stall_kill:g}s")

    # -- ending a conversation ------------------------------------------------------------------

    def _end_conversation(self, agent_id: str, run: RunWatch) -> None:
        """The agent's last turn ended and nothing waits (no open question, no message not
        yet taken up): close its stdin so it exits; TERM, then KILL, if it lingers."""
        if self.questions.pending_for(agent_id):
            return
        handle = self.handles.get(agent_id)
        if handle is None:
            return
        run.session_ended = True
        handle.close_stdin()
        self.background.spawn(f"end:{agent_id}", self._await_end(agent_id, handle))

    async def _await_end(self, agent_id: str, handle: AgentProcess) -> None:
        grace = self.settings.scheduler.stop_grace_seconds
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                log.warning(
                    "agent %s did not exit after its result; sending %s", agent_id, sig.name
                )
                handle.signal(sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if handle.exit_status() is not None or not handle.group_alive():
                    return
                await asyncio.sleep(0.02)

    def _nudge(self, agent_id: str, run: RunWatch, text: str, *, why: str) -> bool:
        """Send ``text`` as a follow-up to wake the agent (once per run for a stall)."""
        run.nudged = True
        try:
            self.follow_up(agent_id, text)
        except GriddError as exc:
            self.bus.publish(
                "agent.warning",
                {"agentId": agent_id, "warning": f"could not nudge it after {why}: {exc.message}"},
            )
            return False
        agent = self.state.agents[agent_id]
        self.bus.publish(
            "agent.nudged",
            {"agentId": agent_id, "taskId": agent.task_id, "reason": why, "text": text},
        )
        return True

    def follow_up(self, agent_id: str, text: str) -> None:
        """Tell a working agent ``text`` unasked (``respond`` with no question pending)."""
        run = self.runs.get(agent_id)
        if run is None or agent_id not in self.handles:
            raise Conflict(f"agent {agent_id!r} is not running", code="agent_not_running")
        if run.session_ended:
            raise Conflict(
                f"agent {agent_id!r} has finished its conversation and is exiting",
                code="agent_finishing",
            )
        line = run.adapter.encode_follow_up(text)
        if line is None:
            raise Conflict(
                f"agent {agent_id!r} has no pending question and takes no other message",
                code="no_pending_question",
            )
        self.write_stdin(agent_id, line)
        run.last_life = time.monotonic()

    # -- stopping --------------------------------------------------------------------------------

    def request_stop(self, agent_id: str, reason: str, *, force: bool = False) -> None:
        """Ask an agent to stop: SIGTERM to its group, SIGKILL after the grace period."""
        agent = self.state.agents.get(agent_id)
        if agent is None or agent.status == AgentStatus.EXITED:
            return
        if agent_id not in self.handles:
            # Its spawn is still in flight, or it has exited and is being finished: nothing
            # to signal. What is wanted stays recorded; the next pass asks again.
            return
        if agent_id in self.stops and (self.stops[agent_id] or not force):
            return  # already being stopped (or killed) by this daemon
        self.stops[agent_id] = force
        move_agent(self.state, agent_id, AgentStatus.STOPPING, reason=reason, stop_reason=reason)
        self.background.spawn(f"stop:{agent_id}", self._stop(agent_id, force=force))

    async def _stop(self, agent_id: str, *, force: bool) -> None:
        handle = self.handles.get(agent_id)
        if handle is None:
            return
        if force:
            handle.signal(signal.SIGKILL)
            return
        handle.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.scheduler.stop_grace_seconds
        while time.monotonic() < deadline:
            # Wait for the whole group: a child that outlives the agent is killed as well.
            if not handle.group_alive():
                return
            await asyncio.sleep(0.05)
        log.warning(
            "agent %s ignored SIGTERM for %.0fs; killing",
            agent_id,
            self.settings.scheduler.stop_grace_seconds,
        )
        handle.signal(signal.SIGKILL)

    # -- talking to agents -------------------------------------------------------------------------

    def write_stdin(self, agent_id: str, text: str) -> None:
        handle = self.handles.get(agent_id)
        if handle is None:
            raise Conflict(f"agent {agent_id!r} is not running", code="agent_not_running")
        handle.write_stdin(text)

    def deliver_answer(self, question: Question, response: str) -> None:
        """Encode an answer the way this agent's protocol expects, and write it."""
        run = self.runs.get(question.agent_id)
        if run is None or question.agent_id not in self.handles:
            raise Conflict(
                f"agent {question.agent_id} is no longer running; the question cannot be answered",
                code="agent_not_running",
            )
        ask = base.Ask(
            key=question.key,
            type=question.type,
            question=question.question,
            options=list(question.options),
            meta=dict(question.meta),
        )
        self.write_stdin(question.agent_id, run.adapter.encode_answer(ask, response))
        # Its silence while it waited for a human is not a stall: the clock starts again now.
        run.last_life = time.monotonic()

    def output_log(self, agent: Agent) -> OutputLog:
        return OutputLog(Path(agent.run_dir), writer=False)
