"""The Grid service: the one object the API talks to.

It owns the store, the event bus and the background work, builds the ``RepoState`` view and
records intent. The API never touches processes directly (intent goes through state).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Hashable

from gridd import API_VERSION, HANDOVER_PROTOCOL, __version__
from gridd.background import Background
from gridd.commands import Commands
from gridd.diskfault import DISK_PART, DiskFault
from gridd.errors import GriddError
from gridd.events import EventBus
from gridd.finish import Finisher
from gridd.git.merge import MergeQueue
from gridd.git.on_conflict import ConflictPolicy
from gridd.git.prepared import PreparedWorktrees
from gridd.git.private import PrivateRepos
from gridd.git.radar import Radar
from gridd.git.unresolved import Unresolved
from gridd.git.worktrees import Worktrees
from gridd.metrics.daemon import DaemonMetrics
from gridd.metrics.feed import EventCounter
from gridd.model import (
    DaemonInfo,
    Health,
    RepoState,
    TaskStatus,
    VersionInfo,
    WireModel,
    utcnow,
)
from gridd.notify import Notifier
from gridd.pool import AgentPool
from gridd.questions import QuestionBook
from gridd.recovery import recover
from gridd.runs.executor import Executor
from gridd.scheduler import Scheduler
from gridd.settings import Settings
from gridd.sources.beads import SOURCE as BEADS
from gridd.sources.beads import BeadsSource
from gridd.state import GridState
from gridd.store import Store
from gridd.storehealth import STORE_PART, StoreHealth
from gridd.workspace import Workspace

log = logging.getLogger(__name__)

TERMINAL_OK = frozenset({TaskStatus.DONE, TaskStatus.CANCELLED})


class Grid:
    """The service's façade: the parts ``compose`` built, started and stopped in order, and
    the views the API serves (health, version, the state). It builds nothing itself."""

    def __init__(
        self,
        *,
        workspace: Workspace,
        settings: Settings,
        store: Store,
        bus: EventBus,
        background: Background,
        disk: DiskFault,
        state: GridState,
        worktrees: Worktrees,
        private: PrivateRepos,
        questions: QuestionBook,
        executor: Executor,
        pool: AgentPool,
        unresolved: Unresolved,
        finisher: Finisher,
        events: EventCounter,
        scheduler: Scheduler,
        beads: BeadsSource,
        notifier: Notifier,
        conflicts: ConflictPolicy,
        merges: MergeQueue,
        commands: Commands,
        prepared: PreparedWorktrees,
        radar: Radar,
        store_health: StoreHealth,
        warnings: list[str],
    ) -> None:
        self.workspace = workspace
        self.settings = settings
        self.store = store
        self.bus = bus
        self.background = background
        self.supervisor = background.supervisor
        #: Whether ``.grid/`` takes writes (a full or read-only disk pauses starts).
        self.disk = disk
        self.state = state
        self.worktrees = worktrees
        #: Sandboxed runs' own repositories in their worktrees (git/private.py).
        self.private = private
        self.questions = questions
        #: Starts, signals and reattaches agents: here or in boxes (runs/executors.py).
        self.executor = executor
        self.pool = pool
        self.unresolved = unresolved
        self.finisher = finisher
        self.scheduler = scheduler
        self.beads = beads
        self.notifier = notifier
        self.conflicts = conflicts
        self.merges = merges
        self.commands = commands
        self.prepared = prepared
        self.radar = radar
        #: Reads this façade's parts at scrape time (a ``MetricsSource``).
        self.metrics = DaemonMetrics(self, events=events)
        #: The state database's health while running (the part ``store-watch``).
        self.store_health = store_health
        self.started_at = utcnow()
        self._started_mono = time.monotonic()
        #: What ``/health`` warns of besides the parts' states (the store's findings too).
        self.warnings = warnings
        self._shutdown_callback: Callable[[], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self.store_health.announce_opening()
        self.bus.publish("daemon.started", {"pid": os.getpid(), "version": __version__})
        await self.worktrees.setup()
        self.workspace.runs_dir.mkdir(mode=0o700, exist_ok=True)
        beads = self.beads.enabled()
        if beads:  # before recovery: a run reattached with its claim unanswered asks again
            self.pool.claimers[BEADS] = self.beads.claim
        await recover(
            state=self.state,
            pool=self.pool,
            worktrees=self.worktrees,
            private=self.private,
            bus=self.bus,
        )
        self.executor.start()
        if beads:  # the scheduler then never stops a session as idle
            self.beads.start(lambda fields: self.commands.create_from_source(fields, source=BEADS))
        self.notifier.start()
        self.background.supervise("event-log-pruner", self._prune_loop)
        # "store-watch": the part's name in /health and the docs, kept.
        self.background.supervise("store-watch", self.store_health.run, core=True)
        if not self.settings.scheduler.step_mode:
            self.background.supervise("scheduler", self.scheduler.run, core=True)
        self.merges.start()
        self.radar.start()
        if not self.settings.scheduler.step_mode:  # nothing reconciles by itself then
            self.prepared.start()
        if beads:
            await self._first_sync()

    async def _first_sync(self) -> None:
        """Known before served: the daemon answers only once the first ``bd ready`` has
        landed, so a bead that existed before the start is never a 404. The wait is
        bounded; past it (or on a failing bd) /health says beads is degraded."""
        bound = self.settings.beads.first_sync_seconds
        try:
            await asyncio.wait_for(self.beads.first_sync.wait(), bound)
        except TimeoutError:
            log.warning("beads: no answer from 'bd ready' within %gs; serving without it", bound)

    async def stop(self) -> None:
        """End live streams and background work; the caller closes the store afterwards."""
        self.supervisor.stop()
        await self.notifier.stop()
        self.executor.close()
        self.pool.egress.close_all()  # a restarted daemon opens them again, on their ports
        self._end_streams()
        await self.background.stop()
        self.pool.wakeups.close()

    def on_shutdown_request(self, callback: Callable[[], None]) -> None:
        self._shutdown_callback = callback

    def _end_streams(self) -> None:
        """Say goodbye on the event stream and end every live subscriber (once). The
        goodbye is best-effort: a disk that takes no writes never holds up a stop."""
        if not self.bus.closed:
            try:
                self.bus.publish("daemon.stopping", {"pid": os.getpid()})
            except GriddError as exc:
                log.error("stopping without a daemon.stopping event: %s", exc.message)
            self.bus.close()

    def shutdown_stopping_agents(self) -> int:
        """``POST /shutdown?agents=1``: stop every live agent as a session stop does
        (SIGTERM, SIGKILL after ``stop_grace_seconds``; what each did is committed, its
        task goes back to ``ready``), then shut down once all are gone. How many it stops."""
        live = len(self.state.live_agents())
        if live:
            self.scheduler.stop_session("shutdown")
        self.background.spawn("shutdown-after-agents", self._shutdown_when_stopped())
        return live

    async def _shutdown_when_stopped(self) -> None:
        deadline = time.monotonic() + self.shutdown_wait_seconds()
        while self.state.live_agents() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.state.live_agents():
            log.warning("shutting down with agents still stopping; they end by themselves")
        self.request_shutdown()

    def shutdown_wait_seconds(self) -> float:
        """How long ``shutdown_stopping_agents`` may wait for its agents: their SIGTERM
        grace, then SIGKILL and their finish."""
        return self.settings.scheduler.stop_grace_seconds + 10.0

    def request_shutdown(self) -> None:
        self.scheduler.close()  # nothing new starts while the daemon winds down
        # Close the streams first: open SSE responses would otherwise hold the server open.
        self._end_streams()
        if self._shutdown_callback is not None:
            self._shutdown_callback()

    async def _prune_loop(self) -> None:
        while True:
            self.state.save_positions_now()  # the positions mark never holds pruning back
            removed = self.store.prune_events(self.settings.events.retain)
            if removed:
                log.info("pruned %d old events", removed)
            await asyncio.sleep(60)

    # -- views ---------------------------------------------------------------------------

    @property
    def uptime(self) -> float:
        return round(time.monotonic() - self._started_mono, 3)

    def health_key(self) -> Hashable:
        """Equal for as long as ``health()`` would report the same, its uptime aside (read
        on every ``/health``: cheap when nothing is wrong)."""
        paused = self.pool.monitor.paused
        return (
            self.supervisor.revision,
            tuple(self.warnings),
            tuple(paused.items()) if paused else (),
            self.store.write_error,
            self.store.slow_reason(),
            self.beads.problem() if self.beads.running else None,
            self.disk.reason,
        )

    def health(self) -> Health:
        """Degraded when there are warnings or a supervised part is not up; ``core_down``
        (HTTP 503) when a core part is not up."""
        supervisor = self.supervisor
        degraded = supervisor.degraded()
        core_down = bool(supervisor.core_down())
        warnings = list(self.warnings)
        for agent_id, why in sorted(self.pool.monitor.paused.items()):
            warnings.append(f"agent {agent_id}: watching paused ({why}); retrying")
        error = self.store.write_error
        if error is not None:  # read at request time: no wait for the next probe
            degraded = sorted([*degraded, STORE_PART])
            core_down = True
            warnings.append(error.message)
        slow = self.store.slow_reason()
        if slow is not None:  # writes wait (kept in memory meanwhile); not down
            degraded = sorted({*degraded, STORE_PART})
            warnings.append(slow)
        source = self.beads.problem() if self.beads.running else None
        if source is not None:  # a task source out of step: served, but said
            degraded = sorted([*degraded, BEADS])
            warnings.append(source)
        if self.disk.reason is not None:
            degraded = sorted({*degraded, DISK_PART})
            warnings.append(f"{self.disk.reason}: starts are paused until it takes writes")
        # Built without validation: every field is ours and typed (a tenth of a /health).
        return Health.model_construct(
            status="degraded" if warnings or degraded else "ok",
            pid=os.getpid(),
            uptime=self.uptime,
            warnings=warnings,
            degraded=degraded,
            parts=supervisor.states(),
            core_down=core_down,
        )

    def version(self) -> VersionInfo:
        return VersionInfo(
            version=__version__,
            api_version=API_VERSION,
            pid=os.getpid(),
            python=platform.python_version(),
            handover=HANDOVER_PROTOCOL,
        )

    def daemon_info(self) -> DaemonInfo:
        return DaemonInfo(
            version=__version__,
            api_version=API_VERSION,
            pid=os.getpid(),
            uptime=self.uptime,
            workspace=str(self.workspace.root),
            started_at=self.started_at,
            last_event_id=self.bus.last_id,
            subscribers=self.bus.subscriber_count,
            last_beads_sync=self.beads.last_sync_at,
            warnings=list(self.warnings),
            review_edits=self.settings.merge.review_edits,
        )

    def repo_state(self) -> RepoState:
        return RepoState(
            session=self.state.session,
            tasks=list(self.state.tasks.values()),
            agents=self.state.live_agents(),
            pending_questions=self.questions.pending(),
            stats=self.state.stats(),
            daemon=self.daemon_info(),
            conflicts=list(self.radar.items.values()),
            merge_train=self.merges.train,
        )

    def state_json(self) -> bytes:
        """``RepoState`` as JSON from the state cache: tasks and live agents are encoded once
        per change (``GridState.tasks_json``, ``live_agents_json``), so a request costs the
        same with one agent or hundreds, and nothing here walks every agent that ever ran."""

        def dump(value: WireModel | list[WireModel]) -> bytes:
            if isinstance(value, list):
                return json.dumps([v.wire() for v in value], separators=(",", ":")).encode()
            return json.dumps(value.wire(), separators=(",", ":")).encode()

        parts = [
            b'{"session":' + dump(self.state.session),
            b'"tasks":' + self.state.tasks_json(),
            b'"agents":' + self.state.live_agents_json(),
            b'"pendingQuestions":' + dump(list(self.questions.pending())),
            b'"stats":' + dump(self.state.stats()),
            b'"daemon":' + dump(self.daemon_info()),
            b'"conflicts":' + dump(list(self.radar.items.values())),
            b'"mergeTrain":' + (dump(train) if (train := self.merges.train) else b"null") + b"}",
        ]
        return b",".join(parts)


def all_tasks_done(state: GridState) -> bool:
    """Every task done or cancelled (the notifier's ``all_done``)."""
    tasks = state.tasks.values()
    return bool(tasks) and all(t.status in TERMINAL_OK for t in tasks)
