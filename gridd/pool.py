"""The agent pool: start an agent for a task, watch it, stop it, and finish it.

Starting means: the task's worktree (created or reused), a run directory, and a shim that
runs the agent there. Watching means: index its output into ``agent.output`` events and
notice its exit. Finishing means: commit what it left, compute ``changedFiles``, and move
the task to ``review`` (exit 0) or back to ``ready``/``failed`` (anything else). Work is
never thrown away: a failed or stopped agent's worktree stays for the next attempt.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from gridd.agents.output import OutputLog
from gridd.agents.process import AgentProcess, ExitStatus
from gridd.background import Background
from gridd.errors import GriddError
from gridd.events import EventBus
from gridd.model import Agent, AgentStatus, Task, TaskStatus, utcnow
from gridd.settings import AgentProfile, Settings
from gridd.state import GridState
from gridd.workspace import Workspace
from gridd.worktrees import Worktrees

log = logging.getLogger(__name__)

POLL_SECONDS = 0.02


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def render_command(command: list[str], values: Mapping[str, str]) -> list[str]:
    """Substitute ``{prompt}``, ``{task_id}``, ``{worktree}`` inside arguments (no shell).

    One pass: a value is never searched for placeholders itself, so a prompt that mentions
    ``{worktree}`` reaches the agent as written. Unknown ``{names}`` are left alone.
    """

    def value_of(match: re.Match[str]) -> str:
        return values.get(match.group(1), match.group(0))

    return [_PLACEHOLDER.sub(value_of, arg) for arg in command]


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
        environ: Mapping[str, str],
    ) -> None:
        self.ws = workspace
        self.settings = settings
        self.profiles: dict[str, AgentProfile] = settings.profiles()
        self.state = state
        self.bus = bus
        self.worktrees = worktrees
        self.background = background
        self.environ = dict(environ)
        self.handles: dict[str, AgentProcess] = {}
        self.started_mono: dict[str, float] = {}
        self.starting: set[str] = set()
        #: Task ids whose agent has exited and is being finished (commit, new status): until
        #: that is done the task must not get another agent.
        self.finishing: set[str] = set()
        self.not_before: dict[str, float] = {}
        #: Called before the first agent of a task from an external source starts;
        #: False means someone else owns the task (e.g. a lost beads claim).
        self.claimers: dict[str, Callable[[Task], Awaitable[bool]]] = {}

    # -- starting ----------------------------------------------------------------------------

    def backoff(self, attempts: int) -> float:
        sched = self.settings.scheduler
        return float(
            min(sched.backoff_max_seconds, sched.backoff_seconds * 2 ** max(0, attempts - 1))
        )

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
        claimer = self.claimers.get(first.source)
        if claimer is not None and first.attempts == 0 and not await claimer(first):
            self.state.update_task(
                task_id, status=TaskStatus.CANCELLED, error="claimed by someone else"
            )
            return
        session = self.state.session
        base = session.feature_branch if session.started else None
        worktree = await self.worktrees.create(task_id, base)
        task = self.state.tasks.get(task_id)
        if task is None or task.status != TaskStatus.WORKING:
            return  # stopped or cancelled while the worktree was being made
        number = self.state.store.next_counter("agent")
        agent_id = f"{profile_name}-{number}"
        run_dir = self.ws.runs_dir / agent_id
        attempt = task.attempts + 1
        argv = render_command(
            profile.command,
            {
                "prompt": task.prompt or task.title,
                "task_id": task.id,
                "worktree": str(worktree.path),
            },
        )
        env = {
            **self.environ,
            **profile.env,
            "GRID_TASK_ID": task.id,
            "GRID_AGENT_ID": agent_id,
            "GRID_WORKSPACE": str(self.ws.root),
            "GRID_SOCKET": str(self.ws.socket_path),
            "GRID_HEARTBEAT": str(run_dir / "heartbeat.ndjson"),
            "GRID_ATTEMPT": str(attempt),
        }
        self.state.update_task(
            task_id,
            attempts=attempt,
            branch=worktree.branch,
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
        )
        self.state.put_agent(agent)
        try:
            handle = await AgentProcess.spawn(
                run_dir, argv=argv, cwd=worktree.path, env=env, stdin=profile.stdin
            )
        except GriddError as exc:
            self.state.update_agent(
                agent_id, status=AgentStatus.EXITED, ended_at=utcnow(), error=exc.message
            )
            raise
        self.handles[agent_id] = handle
        self.started_mono[agent_id] = time.monotonic()
        self.state.update_agent(
            agent_id, pid=handle.pid, create_time=handle.create_time, status=AgentStatus.RUNNING
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
            },
        )
        self.state.touch()
        self.background.spawn(f"agent:{agent_id}", self._watch(agent_id, handle))

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
            self.state.update_task(
                task_id, status=TaskStatus.FAILED, attempts=attempts, error=message
            )
        else:
            self.not_before[task_id] = time.monotonic() + self.backoff(attempts)
            self.state.update_task(
                task_id, status=TaskStatus.READY, attempts=attempts, error=message
            )

    # -- watching ------------------------------------------------------------------------------

    def reattach(self, agent: Agent) -> None:
        """Resume watching an agent started by an earlier daemon (its shim outlived us)."""
        handle = AgentProcess(Path(agent.run_dir), agent.pid, agent.create_time)
        self.handles[agent.id] = handle
        self.bus.publish(
            "agent.reattached",
            {
                "agentId": agent.id,
                "taskId": agent.task_id,
                "pid": agent.pid,
                "alive": handle.alive(),
            },
        )
        self.background.spawn(f"agent:{agent.id}", self._watch(agent.id, handle))

    def _lost(self, handle: AgentProcess, since: list[float]) -> bool:
        """True once the agent is gone and no exit record appeared within a grace period."""
        shim_done = handle._shim is not None and handle._shim.returncode is not None
        if handle._shim is not None and not shim_done:
            return False
        if handle._shim is None and handle.alive():
            return False
        if not since:
            since.append(time.monotonic())
        return shim_done or time.monotonic() - since[0] > 2.0

    async def _watch(self, agent_id: str, handle: AgentProcess) -> None:
        output = OutputLog(handle.run_dir)
        gone_since: list[float] = []
        while True:
            status = handle.exit_status()
            busy = self._drain(agent_id, output, final=status is not None)
            if status is None and self._lost(handle, gone_since):
                status = handle.exit_status() or ExitStatus(
                    None, None, "the agent's supervisor died; exit status unknown"
                )
            if status is not None:
                while self._drain(agent_id, output, final=True):
                    pass
                await handle.reap_shim()
                await self._finish(agent_id, status)
                return
            await asyncio.sleep(0 if busy else POLL_SECONDS)

    def _drain(self, agent_id: str, output: OutputLog, *, final: bool) -> bool:
        chunks = output.poll(final=final)
        if not chunks:
            return False
        for chunk in chunks:
            self.bus.publish(
                "agent.output", {"agentId": agent_id, "chunk": chunk.text, "seq": chunk.seq}
            )
        last_line = next(
            (line for line in reversed(chunks[-1].text.splitlines()) if line.strip()), ""
        )
        agent = self.state.agents[agent_id]
        self.state.update_agent(
            agent_id,
            persist=False,
            output_seq=output.seq,
            last_output=last_line[-300:] or agent.last_output,
        )
        return True

    # -- finishing -----------------------------------------------------------------------------

    async def _finish(self, agent_id: str, status: ExitStatus) -> None:
        agent = self.state.agents[agent_id]
        self.finishing.add(agent.task_id)
        try:
            await self._finish_agent(agent, status)
        finally:
            self.finishing.discard(agent.task_id)
            self.state.touch()  # the task may take an agent again

    async def _finish_agent(self, agent: Agent, status: ExitStatus) -> None:
        agent_id = agent.id
        self.handles.pop(agent_id, None)
        self.started_mono.pop(agent_id, None)
        self.state.update_agent(
            agent_id,
            status=AgentStatus.EXITED,
            ended_at=utcnow(),
            exit_code=status.code,
            error=status.error,
        )
        task = self.state.tasks.get(agent.task_id)
        try:
            if task is None or task.status != TaskStatus.WORKING:
                await self._finish_stopped(agent, status)
            elif status.code == 0 and agent.stop_reason is None:
                await self._finish_success(agent)
            else:
                self._finish_failure(agent, status)
        except GriddError as exc:
            log.error("finishing agent %s failed: %s", agent_id, exc.message)
            self._finish_failure(agent, ExitStatus(status.exit_code, status.signal, exc.message))
        finally:
            self.state.flush()

    async def _finish_stopped(self, agent: Agent, status: ExitStatus) -> None:
        # Stopped on purpose (task stopped, cancelled, session stopped): keep its work.
        committed = await self.worktrees.commit_all(
            Path(agent.worktree_path), f"gridd: {agent.task_id}: work in progress (agent stopped)"
        )
        self.bus.publish(
            "agent.stopped",
            {
                "agentId": agent.id,
                "taskId": agent.task_id,
                "reason": agent.stop_reason or "stopped",
                "exitCode": status.code,
                "committedWork": committed,
            },
        )

    async def _finish_success(self, agent: Agent) -> None:
        task = self.state.tasks[agent.task_id]
        path = Path(agent.worktree_path)
        await self.worktrees.commit_all(path, f"gridd: {task.id}: {task.title}")
        base = await self.worktrees.base_of(task.branch or "")
        changed = await self.worktrees.changed_files(path, base)
        self.state.update_task(task.id, status=TaskStatus.REVIEW, changed_files=changed, error=None)
        self.bus.publish(
            "agent.completed",
            {
                "agentId": agent.id,
                "taskId": task.id,
                "result": "success",
                "changedFiles": changed,
                "branch": task.branch,
            },
        )

    def _finish_failure(self, agent: Agent, status: ExitStatus) -> None:
        task = self.state.tasks[agent.task_id]
        if agent.stop_reason:
            error = agent.stop_reason
        elif status.error:
            error = status.error
        elif status.signal:
            error = f"killed by signal {signal.Signals(status.signal).name}"
        else:
            error = f"exited with code {status.code}"
        self.bus.publish(
            "agent.failed",
            {"agentId": agent.id, "taskId": task.id, "error": error, "exitCode": status.code},
        )
        if task.attempts >= task.max_attempts:
            self.state.update_task(task.id, status=TaskStatus.FAILED, error=error)
        else:
            self.not_before[task.id] = time.monotonic() + self.backoff(task.attempts)
            self.state.update_task(task.id, status=TaskStatus.READY, error=error)

    # -- stopping --------------------------------------------------------------------------------

    def request_stop(self, agent_id: str, reason: str, *, force: bool = False) -> None:
        """Ask an agent to stop: SIGTERM to its group, SIGKILL after the grace period."""
        agent = self.state.agents.get(agent_id)
        if agent is None or agent.status == AgentStatus.EXITED:
            return
        if agent.status == AgentStatus.STOPPING and not force:
            return
        self.state.update_agent(agent_id, status=AgentStatus.STOPPING, stop_reason=reason)
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

    def write_stdin(self, agent_id: str, text: str) -> None:
        handle = self.handles[agent_id]
        handle.write_stdin(text)

    def output_log(self, agent: Agent) -> OutputLog:
        return OutputLog(Path(agent.run_dir))

    def live_count(self) -> int:
        return len(self.handles)


def environ_snapshot() -> dict[str, str]:
    return dict(os.environ)
