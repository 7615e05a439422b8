"""The agent pool: the one object the scheduler, the commands and recovery talk to about
agents. It composes the parts and holds no logic of its own:

    spawning.py     a task marked working -> worktree, run directory, process (executor)
    reattaching.py  agents of an earlier daemon -> watched again
    monitoring.py     one monitor per agent: wakes on exits and deadlines, judges health,
                    on exit reads the rest and calls the finisher (``on_exit``)
    batching.py     the output pass: every run that wrote, read and published together
                    (what a look means: reading.py)
    talking.py      answers, follow-ups and nudges to an agent's stdin
    stopping.py     stop, kill, and the end of a finished conversation
    roster.py       what is live in this daemon; shared with the finisher (``finish.py``)

Processes are started, signalled and reattached only through the executor
(``runs/executor.py``); the pool never knows how (the local shim executor today).

The roster's tables are the pool's: others read them through read-only views
(``handles``, ``starting``, ``not_before``, ...) and change them through its methods
(``will_start``, ``clear_backoff``), never directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType

from gridd.background import Background
from gridd.diskfault import DiskFault
from gridd.events import EventBus
from gridd.git.prepared import PreparedWorktrees
from gridd.git.private import PrivateRepos
from gridd.git.worktrees import Worktrees
from gridd.model import Agent, Question
from gridd.pool.context import PoolContext
from gridd.pool.monitoring import Monitor, OnExit
from gridd.pool.reading import RunReader
from gridd.pool.reattaching import Reattacher
from gridd.pool.roster import Roster
from gridd.pool.spawning import Claimer, Spawner
from gridd.pool.stopping import Stopper
from gridd.pool.talking import Conversation, output_log
from gridd.questions import QuestionBook
from gridd.runs.egress import EgressProxies
from gridd.runs.executor import AgentHandle, Executor
from gridd.runs.output import OutputLog
from gridd.runs.wakeups import Wakeups
from gridd.runs.watch import RunWatch
from gridd.settings import AgentProfile, Settings
from gridd.state import GridState
from gridd.workspace import Workspace


class AgentPool:
    def __init__(
        self,
        *,
        workspace: Workspace,
        settings: Settings,
        state: GridState,
        bus: EventBus,
        worktrees: Worktrees,
        private: PrivateRepos,
        background: Background,
        questions: QuestionBook,
        executor: Executor,
        environ: Mapping[str, str],
        disk: DiskFault,
        roster: Roster,
        profiles: dict[str, AgentProfile],
        on_exit: OnExit | None = None,
        prepared: PreparedWorktrees | None = None,
    ) -> None:
        self.settings = settings
        self.state = state
        self.executor = executor
        self.profiles = profiles
        #: Shared with the finisher, which releases agents from it (built by the root).
        self.roster = roster
        self.roster.restore_backoffs(list(state.tasks.values()))
        self.bus = bus
        #: Each sandboxed run's filtering proxy (``network = "allowlist"``).
        self.egress = EgressProxies(self._sandbox_denied, spawn=background.spawn)
        self.ctx = ctx = PoolContext(
            workspace=workspace,
            settings=settings,
            profiles=self.profiles,
            state=state,
            bus=bus,
            background=background,
            questions=questions,
            executor=executor,
            roster=self.roster,
            disk=disk,
            egress=self.egress,
        )
        watch = settings.watch
        self.wakeups = Wakeups(
            notify=watch.notify,
            sweep_seconds=watch.sweep_seconds,
            fallback_seconds=watch.fallback_seconds,
            coalesce_seconds=watch.coalesce_seconds,
        )
        self.talk = Conversation(ctx)
        self.stopper = Stopper(ctx)
        reader = RunReader(ctx, talk=self.talk, stopper=self.stopper)
        self.monitor = Monitor(
            ctx,
            reader=reader,
            stopper=self.stopper,
            talk=self.talk,
            wakeups=self.wakeups,
            on_exit=on_exit,
        )
        self.spawner = Spawner(
            ctx,
            worktrees=worktrees,
            private=private,
            monitor=self.monitor,
            environ=environ,
            prepared=prepared,
        )
        self.reattacher = Reattacher(ctx, monitor=self.monitor)
        self.claimers: dict[str, Claimer] = self.spawner.claimers

    def _sandbox_denied(self, agent_id: str, target: str, unreported: int) -> None:
        """A run's proxy refused a host (``runs/egress.py``, rate-limited there)."""
        self.ctx.sandbox_denied(agent_id, "network", target, unreported)

    # -- the roster, read-only (the scheduler, the commands, /metrics) ---------------------------

    @property
    def handles(self) -> Mapping[str, AgentHandle]:
        """The agents this daemon watches, by id."""
        return MappingProxyType(self.roster.handles)

    @property
    def runs(self) -> Mapping[str, RunWatch]:
        return MappingProxyType(self.roster.runs)

    @property
    def started_mono(self) -> Mapping[str, float]:
        """When each watched agent started (monotonic)."""
        return MappingProxyType(self.roster.started_mono)

    @property
    def stops(self) -> Mapping[str, bool]:
        """Agents with a stop in flight in this daemon (True: a kill)."""
        return MappingProxyType(self.roster.stops)

    @property
    def starting(self) -> frozenset[str]:
        """Tasks whose agent is being started."""
        return frozenset(self.roster.starting)

    @property
    def finishing(self) -> frozenset[str]:
        """Tasks whose agent has exited and is being finished."""
        return frozenset(self.roster.finishing)

    @property
    def not_before(self) -> Mapping[str, float]:
        """Each backed-off task's monotonic deadline."""
        return MappingProxyType(self.roster.not_before)

    # -- the roster's changes ------------------------------------------------------------------

    def will_start(self, task_id: str) -> None:
        """The scheduler starts the task now: its backoff is over, and it counts as starting
        until its agent is recorded (or the start fails)."""
        self.roster.not_before.pop(task_id, None)
        self.roster.starting.add(task_id)

    def clear_backoff(self, task_id: str) -> None:
        """A human started the task again: no backoff holds it back."""
        self.roster.not_before.pop(task_id, None)

    def backoff(self, attempts: int) -> float:
        return self.roster.backoff(attempts)

    async def start(self, task_id: str, profile_name: str) -> None:
        """Spawn an agent for a task already marked ``working``. Failures retry later."""
        await self.spawner.start(task_id, profile_name)

    async def reattach(self, agent: Agent) -> None:
        if not agent.claim_pending:
            await self.reattacher.reattach(agent)
            return
        # The recheck's gate is set before the run's monitor can finish it; its answer is
        # acted on once the run is registered: a box's reattach awaits the engine in a
        # thread, and a stop asked for meanwhile would find no run to stop.
        reattached = asyncio.get_running_loop().create_future()
        self.spawner.recheck_claim(agent, after=reattached)
        try:
            await self.reattacher.reattach(agent)
        finally:
            reattached.set_result(None)

    def request_stop(self, agent_id: str, reason: str, *, force: bool = False) -> None:
        self.stopper.request_stop(agent_id, reason, force=force)

    def write_stdin(self, agent_id: str, text: str) -> None:
        self.talk.write_stdin(agent_id, text)

    def follow_up(self, agent_id: str, text: str) -> None:
        self.talk.follow_up(agent_id, text)

    def deliver_answer(self, question: Question, response: str) -> None:
        self.talk.deliver_answer(question, response)

    def output_log(self, agent: Agent) -> OutputLog:
        return output_log(agent)
