"""The reconcile loop: wake on any change or a tick, observe, ``plan()``, apply.

Level-triggered, as kopf and circus do it: each pass recomputes what should run from the
whole state, so a missed wake-up or a crashed start costs one tick, never correctness.
Applying is ordered (stops, then status changes, then starts) and every action is
idempotent; a start runs in the background so one slow ``git worktree add`` never holds up
the others.

**Big states.** ``plan()`` looks at every task: with 50,000 of them a pass is 130 ms of
CPU on an idle machine and ~0.8 s on a loaded one, and every change asks for one. Past
``PLAN_OFF_LOOP_ABOVE`` tasks the loop's passes plan on a worker thread, against the same
immutable snapshot (``Observed``), while the loop goes on answering. What changed meanwhile
makes the plan stale: it is thrown away and made again (``_marker``), and after
``PLAN_TRIES`` stale plans in a row the pass plans on the loop, so changes that never stop
cannot keep the scheduler from deciding. ``step()`` always plans on the loop.

**Step mode.** ``step()`` reconciles once and returns what it did, after the starts it
launched have run. ``POST /scheduler/step`` exposes it, so a test (or a curious user) can ask
"what does the scheduler decide right now?" instead of sleeping and hoping a tick passed.
With ``[scheduler] step_mode = true`` the loop does not run by itself at all: only steps
reconcile, which makes every decision observable one at a time.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable, Sequence

from gridd import lifecycle
from gridd.background import Background
from gridd.diskfault import DiskFault
from gridd.events import EventBus
from gridd.lifecycle import Move, intend_stop, move_task, move_tasks
from gridd.model import SessionState, TaskStatus, utcnow
from gridd.plan import (
    Action,
    AgentView,
    Observed,
    SetStatus,
    StartTask,
    StopAgent,
    StopSession,
    plan,
)
from gridd.pool import AgentPool
from gridd.settings import Settings
from gridd.state import GridState
from gridd.workspace import Workspace

log = logging.getLogger(__name__)

#: Past this many tasks the loop's passes plan on a worker thread (a pass over 2,000 tasks
#: is ~5 ms; over 50,000 it is ~130 ms of CPU).
PLAN_OFF_LOOP_ABOVE = 2_000
#: Plans made off the loop and found stale before one plans on the loop.
PLAN_TRIES = 3


def describe(action: Action) -> dict[str, object]:
    """One action of a pass as plain fields (``action`` names the kind)."""
    if isinstance(action, StartTask):
        return {"action": "start", "task_id": action.task_id, "profile": action.profile}
    if isinstance(action, StopAgent):
        return {
            "action": "stop",
            "agent_id": action.agent_id,
            "task_id": action.task_id,
            "reason": action.reason,
            "force": action.force,
        }
    if isinstance(action, SetStatus):
        return {
            "action": "set_status",
            "task_id": action.task_id,
            "status": str(action.status),
            "reason": action.reason,
        }
    return {"action": "stop_session", "reason": action.reason}


class Scheduler:
    def __init__(
        self,
        *,
        workspace: Workspace,
        settings: Settings,
        state: GridState,
        bus: EventBus,
        pool: AgentPool,
        background: Background,
        disk: DiskFault,
        held: Callable[[], frozenset[str]] | None = None,
        more_work_may_arrive: Callable[[], bool] = lambda: False,
    ) -> None:
        self.ws = workspace
        self.settings = settings
        self.state = state
        self.bus = bus
        self.pool = pool
        self.background = background
        self._wake = asyncio.Event()
        self.passes = 0
        self.idle_passes = 0
        self._last_key: tuple[object, ...] | None = None
        self._next_resume: float | None = None  # earliest rate-limit reset (epoch seconds)
        self._deadlines_key: tuple[object, ...] | None = None
        self._deadlines_cache: list[tuple[float, str]] = []
        #: True when tasks can appear on their own (beads): never stop a session as idle.
        self.more_work_may_arrive = more_work_may_arrive
        self.last_pass_seconds = 0.0
        #: Ready tasks to hold back (the conflict radar's policy).
        self.held = held
        #: The starts launched by the pass in progress (``step()`` waits for them).
        self._launched: list[asyncio.Task[object]] = []
        #: A stopping daemon's scheduler starts nothing more (``close``).
        self.closed = False
        #: While ``.grid/`` refuses writes no pass starts anything (``diskfault.py``).
        self.disk = disk
        state.on_change(self.wake)
        disk.on_clear(self.wake)

    def close(self) -> None:
        """The daemon is stopping: from now on no pass runs, so no agent starts between
        ``daemon.stopping`` and the daemon's exit (running agents go on, and are reattached
        by the next daemon)."""
        self.closed = True

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        tick = self.settings.scheduler.tick_seconds
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), tick)
            except TimeoutError:
                pass
            self._wake.clear()
            # A failing pass ends this run: the supervisor restarts it with backoff and
            # reports the scheduler degraded meanwhile (a pass that always fails is seen).
            if len(self.state.tasks) > PLAN_OFF_LOOP_ABOVE:
                await self.run_pass_off_loop()
            else:
                self.run_pass()
            await asyncio.sleep(0)

    # -- one pass ------------------------------------------------------------------------------

    def observe(self) -> Observed:
        now = time.monotonic()
        profiles = self.pool.profiles
        agents: list[AgentView] = []
        for agent in self.state.live_agents():
            started = self.pool.started_mono.get(agent.id)
            if started is None:
                started = now - (utcnow() - agent.started_at).total_seconds()
            agents.append(
                AgentView(
                    id=agent.id,
                    task_id=agent.task_id,
                    profile=agent.profile,
                    started=started,
                    stopping=agent.id in self.pool.stops,
                    intent=agent.intent,
                    stop_reason=agent.stop_reason,
                    killing=self.pool.stops.get(agent.id, False),
                )
            )
        timeouts: dict[str, float] = {}
        for view in agents:
            limit = self._timeout(view.task_id, view.profile)
            if limit is not None:
                timeouts[view.task_id] = limit
        session = self.state.session
        return Observed(
            now=now,
            session_started=session.started,
            max_agents=session.max_agents,
            tasks=list(self.state.tasks.values()),
            agents=agents,
            starting=frozenset(self.pool.starting | self.pool.finishing),
            finishing=frozenset(self.pool.finishing),
            not_before=dict(self.pool.not_before),
            profile_limits={n: p.concurrency for n, p in profiles.items() if p.concurrency},
            default_profile=self.settings.scheduler.default_agent,
            stop_file=self.ws.stop_file.exists(),
            timeouts=timeouts,
            wall_now=time.time(),
            auto_resume=self.settings.scheduler.auto_resume,
            budget_left=self._budget_left(),
            estimates={n: p.cost_per_session or 0.0 for n, p in profiles.items()},
            stop_when_idle=self.settings.scheduler.stop_when_idle
            and not self.more_work_may_arrive(),
            held=self.held() if self.held is not None else frozenset(),
        )

    def _budget_left(self) -> float | None:
        """What the session may still spend: its budget less finished runs, running runs
        (what they reported so far, or their profile's estimate if that is more) and spawns
        still in flight (which have no agent yet, but will cost the same)."""
        session = self.state.session
        if session.budget_usd is None:
            return None

        def estimate(profile_name: str) -> float:
            profile = self.pool.profiles.get(profile_name)
            return profile.cost_per_session if profile and profile.cost_per_session else 0.0

        running = 0.0
        live = self.state.live_agents()
        for agent in live:
            running += max(agent.cost_usd or 0.0, estimate(agent.profile))
        with_agent = {a.task_id for a in live}
        for task_id in self.pool.starting - with_agent:
            task = self.state.tasks.get(task_id)
            if task is not None:
                running += estimate(task.agent or self.settings.scheduler.default_agent)
        return session.budget_usd - session.spent_usd - running

    def _timeout(self, task_id: str, profile_name: str) -> float | None:
        """The task's own timeout, else its profile's, else none."""
        task = self.state.tasks.get(task_id)
        profile = self.pool.profiles.get(profile_name)
        return (task.timeout_seconds if task else None) or (
            profile.timeout_seconds if profile else None
        )

    def _deadlines(self) -> list[tuple[float, str]]:
        """Every live agent's timeout deadline (monotonic), soonest first. Rebuilt only
        when something it depends on changed (a state revision, an agent started or
        reattached, the profiles), not on every pass: the idle check stays O(1) per pass
        with hundreds of live agents."""
        key = (self.state.revision, len(self.pool.started_mono), id(self.pool.profiles))
        if key != self._deadlines_key:
            deadlines = []
            for agent in self.state.live_agents():
                limit = self._timeout(agent.task_id, agent.profile)
                started = self.pool.started_mono.get(agent.id)
                if limit is not None and started is not None:
                    deadlines.append((started + limit, agent.id))
            deadlines.sort()
            self._deadlines_cache, self._deadlines_key = deadlines, key
        return self._deadlines_cache

    def _idle_key(self) -> tuple[object, ...]:
        """What can change the plan without a state revision: time-based facts only."""
        now = time.monotonic()
        expired = sum(1 for t in self.pool.not_before.values() if t <= now)
        deadlines = self._deadlines()
        overdue = bisect.bisect_left(deadlines, (now, ""))  # deadline < now: overdue
        resume_due = self._next_resume is not None and time.time() >= self._next_resume
        return (
            self.state.revision,
            self.ws.stop_file.exists(),
            expired,
            tuple(agent_id for _, agent_id in deadlines[:overdue]),
            resume_due,
            self.disk.reason is None,
        )

    async def step(self) -> list[Action]:
        """Reconcile once, now, whatever the idle check says; wait for the starts this pass
        launched (spawned or failed), and return what it did."""
        actions = self.run_pass(force=True)
        launched, self._launched = self._launched, []
        if launched:
            await asyncio.wait(launched)
        return actions

    def run_pass(self, *, force: bool = False) -> list[Action]:
        """One reconcile pass; returns its actions. Skipped (no actions) when nothing it
        depends on has changed (idle)."""
        self._launched = []
        if self.closed:
            return []
        started = time.perf_counter()
        key = self._idle_key()
        if key == self._last_key and not force:
            self.idle_passes += 1
            self.last_pass_seconds = time.perf_counter() - started
            return []
        observed = self.observe()
        return self._apply(_decided(observed), started)

    async def run_pass_off_loop(self) -> list[Action]:
        """``run_pass`` with the plan made on a worker thread; made again when what it was
        made from changed meanwhile, and on the loop after ``PLAN_TRIES`` stale plans."""
        for _ in range(PLAN_TRIES):
            self._launched = []
            if self.closed:
                return []
            started = time.perf_counter()
            key = self._idle_key()
            if key == self._last_key:
                self.idle_passes += 1
                self.last_pass_seconds = time.perf_counter() - started
                return []
            marker = self._marker()
            decided = await asyncio.to_thread(_decided, self.observe())
            if self.closed:
                return []
            if self._marker() == marker:
                return self._apply(decided, started)
        return self.run_pass()

    def _marker(self) -> tuple[object, ...]:
        """What a plan is made from that can change while it is made off the loop: the
        state's revision, the spawns, finishes and stops in flight, and the live agents
        (each change of one replaces its object; the list keeps them, so no id is reused)."""
        return (
            self.state.revision,
            frozenset(self.pool.starting),
            frozenset(self.pool.finishing),
            frozenset(self.pool.stops.items()),
            tuple(self.pool.not_before.items()),
            _Same(self.state.live_agents()),
            self.disk.reason is None,
        )

    def _apply(self, decided: tuple[list[Action], float | None], started: float) -> list[Action]:
        """Carry out a pass's actions (``_decided``): stops, status changes, then starts."""
        actions, self._next_resume = decided
        if self.disk.reason is not None:
            # Each start would fail on the disk and be put back: none until it takes writes.
            actions = [a for a in actions if not isinstance(a, StartTask)]
        status_updates: dict[str, Move] = {}
        for action in actions:
            if isinstance(action, StopSession):
                if action.reason == "stop_file":
                    self.ws.stop_file.unlink(missing_ok=True)
                self.stop_session(action.reason)
            elif isinstance(action, StopAgent):
                self.pool.request_stop(action.agent_id, action.reason, force=action.force)
            elif isinstance(action, SetStatus):
                fields: dict[str, object] = {"error": action.reason}
                if self.state.tasks[action.task_id].status == TaskStatus.RATE_LIMITED:
                    fields["resume_at"] = None  # resumed: no longer parked until then
                status_updates[action.task_id] = Move(
                    action.status, action.reason or "dependencies", fields
                )
            elif isinstance(action, StartTask):
                if status_updates:
                    move_tasks(self.state, status_updates)
                    status_updates = {}
                task = self.state.tasks[action.task_id]
                if task.status != TaskStatus.WORKING:
                    move_task(
                        self.state,
                        task.id,
                        TaskStatus.WORKING,
                        reason="scheduled",
                        backoff_until=None,
                    )
                self.pool.will_start(task.id)
                self._launched.append(
                    self.background.spawn(
                        f"start:{task.id}", self.pool.start(task.id, action.profile)
                    )
                )
        if status_updates:
            move_tasks(self.state, status_updates)
        self.state.flush()
        self._last_key = self._idle_key() if not actions else None
        self.passes += 1
        self.last_pass_seconds = time.perf_counter() - started
        return actions

    # -- the session -------------------------------------------------------------------------------

    def start_session(
        self, feature_branch: str | None, max_agents: int, budget_usd: float | None
    ) -> SessionState:
        if self.ws.stop_file.exists():
            # A STOP left from before is not a request to stop the session asked for now.
            self.ws.stop_file.unlink(missing_ok=True)
            self.bus.publish("session.stop_file_cleared", {"path": str(self.ws.stop_file)})
        session = lifecycle.start_session(
            self.state, feature_branch=feature_branch, max_agents=max_agents, budget_usd=budget_usd
        )
        self.bus.publish(
            "session.started",
            {"featureBranch": feature_branch, "maxAgents": max_agents, "budgetUsd": budget_usd},
        )
        if budget_usd is None:
            self.warn_unbudgeted()
        return session

    def warn_unbudgeted(self) -> None:
        self.bus.publish(
            "session.unbudgeted",
            {"warning": "this session has no budget cap: nothing limits what agents spend"},
        )

    def stop_session(self, reason: str, *, force: bool = False) -> SessionState:
        """Stop every agent (gracefully unless ``force``); their tasks return to ready."""
        lifecycle.stop_session(self.state, reason)
        why = f"session stopped ({reason})"
        updates: dict[str, Move] = {}
        for agent in self.state.live_agents():
            task = self.state.tasks.get(agent.task_id)
            if task is not None and task.status == TaskStatus.WORKING:
                updates[task.id] = Move(TaskStatus.READY, why)
        if updates:
            move_tasks(self.state, updates)
        for agent in self.state.live_agents():
            # Recorded, then carried out by the next pass (after a restart, too).
            intend_stop(self.state, agent.id, "kill" if force else "stop", why)
        # Explicit starts without an agent yet also go back to waiting.
        leftovers = {
            t.id: Move(TaskStatus.READY, why)
            for t in self.state.tasks.values()
            if t.status == TaskStatus.WORKING and self.state.agent_for_task(t.id) is None
        }
        if leftovers:
            move_tasks(self.state, leftovers)
        self.state.flush()
        self.bus.publish("session.stopped", {"reason": reason, "force": force})
        return self.state.session


def _decided(observed: Observed) -> tuple[list[Action], float | None]:
    """A pass's decision: ``plan(observed)``, and the earliest rate-limit reset among the
    tasks (epoch seconds), which the idle check watches. Reads only ``observed``: it may run
    on a worker thread."""
    resumes = [
        t.resume_at.timestamp()
        for t in observed.tasks
        if t.status == TaskStatus.RATE_LIMITED and t.resume_at is not None
    ]
    return plan(observed), min(resumes) if resumes else None


class _Same:
    """Objects compared by identity, in order (live agents: a change replaces the object)."""

    __slots__ = ("items",)

    def __init__(self, items: Sequence[object]) -> None:
        self.items = items

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Same)
            and len(self.items) == len(other.items)
            and all(a is b for a, b in zip(self.items, other.items, strict=True))
        )

    __hash__ = None  # type: ignore[assignment]
