"""The composition root of the service: every part of a daemon built once, through its
constructor, in dependency order, and handed to the ``Grid`` (kopf's ``spawn_tasks`` is the
model). Nothing is assigned onto a part after it is built, and nothing below this reads the
environment: ``environ`` (the daemon's own, read once by ``daemon.run``) is passed down to
the parts that hand it to agents and notification commands.

Who calls whom, where two parts need each other, is settled here without a late
assignment: the finisher and the pool share the ``Roster`` built here (the pool calls the
finisher through ``on_exit``; the finisher releases agents from the roster); worktrees made
ahead ask the roster, not the pool, what is busy; the beads source is handed the commands'
``create_from_source`` when it starts (``Grid.start``), not at construction, and the
commands ask it for unknown ids only once it runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from gridd.background import Background
from gridd.commands import Commands
from gridd.diskfault import DiskFault
from gridd.events import EventBus
from gridd.finish import Finisher
from gridd.git import radar
from gridd.git.merge import MergeQueue, PauseSeam
from gridd.git.on_conflict import ConflictPolicy
from gridd.git.prepared import PreparedWorktrees
from gridd.git.private import PrivateRepos
from gridd.git.radar import Radar
from gridd.git.unresolved import UNRESOLVED_QUESTION, Unresolved
from gridd.git.worktrees import Worktrees
from gridd.grid import Grid, all_tasks_done
from gridd.metrics.feed import EventCounter
from gridd.model import Question
from gridd.notify import Notifier
from gridd.pool import AgentPool
from gridd.pool.roster import Roster
from gridd.questions import QuestionBook
from gridd.runs.executor import Executor
from gridd.runs.executors import build_executor
from gridd.scheduler import Scheduler
from gridd.settings import Settings
from gridd.sources.beads import BeadsSource
from gridd.state import GridState
from gridd.store import Store
from gridd.storehealth import StoreHealth
from gridd.workspace import Workspace


def compose(
    *,
    workspace: Workspace,
    settings: Settings,
    store: Store,
    environ: Mapping[str, str],
    executor: Executor | None = None,
    merge_pause: PauseSeam | None = None,
) -> Grid:
    """The daemon's object graph for ``workspace``, not started (``Grid.start``).
    ``executor``: another executor than the configured one, at the seam (tests)."""
    bus = EventBus(
        store,
        queue_size=settings.events.subscriber_queue,
        queue_bytes=settings.events.subscriber_bytes,
        total_bytes=settings.events.total_bytes,
        stall_seconds=settings.events.stall_seconds,
    )

    def announce(kind: str, data: dict[str, Any]) -> None:
        """The supervisor's daemon.degraded / daemon.recovered (a full disk raises
        StoreError here; the supervisor logs it and restarts the part regardless)."""
        bus.publish(kind, dict(data))

    background = Background(settings.supervisor, announce=announce)
    # Whether ``.grid/`` takes writes (a full or read-only disk pauses starts).
    disk = DiskFault(workspace.grid_dir, announce=background.supervisor.announce_safely)
    state = GridState(store, bus)
    warnings: list[str] = []  # /health's, appended to by the store's health
    store_health = StoreHealth(
        store=store, bus=bus, supervisor=background.supervisor, disk=disk, warnings=warnings
    )
    worktrees = Worktrees(workspace.root, workspace.worktrees_dir)
    # Sandboxed runs' own repositories in their worktrees (git/private.py).
    private = PrivateRepos(worktrees)
    questions = QuestionBook(store=store, state=state, bus=bus)
    # Starts, signals and reattaches agents: here or in boxes (runs/executors.py).
    executor = executor or build_executor(workspace, settings, environ=environ)
    roster = Roster(settings.scheduler)
    profiles = settings.profiles()
    unresolved = Unresolved(
        settings=settings.merge, state=state, bus=bus, worktrees=worktrees, questions=questions
    )
    finisher = Finisher(
        settings=settings,
        state=state,
        bus=bus,
        roster=roster,
        profiles=profiles,
        worktrees=worktrees,
        private=private,
        questions=questions,
        unresolved=unresolved,
    )
    events = EventCounter()
    prepared = PreparedWorktrees(
        state=state,
        worktrees=worktrees,
        background=background,
        ahead=settings.scheduler.prepare_ahead,
        # A run set aside (its claim lost) is in its worktree until finished, its task ready.
        busy=lambda: roster.starting | roster.finishing | roster.disowned.keys(),
    )
    pool = AgentPool(
        workspace=workspace,
        settings=settings,
        state=state,
        bus=bus,
        worktrees=worktrees,
        private=private,
        background=background,
        questions=questions,
        executor=executor,
        environ=environ,
        disk=disk,
        roster=roster,
        profiles=profiles,
        on_exit=events.timed_exit(finisher.finish),
        prepared=prepared,
    )
    overlaps = Radar(
        state=state,
        bus=bus,
        root=workspace.root,
        background=background,
        period=settings.merge.radar_seconds,
        looks_per_second=settings.merge.radar_looks_per_second,
    )
    beads = BeadsSource(
        workspace=workspace,
        settings=settings.beads,
        state=state,
        bus=bus,
        background=background,
        default_agent=settings.beads.default_agent,
    )
    scheduler = Scheduler(
        workspace=workspace,
        settings=settings,
        state=state,
        bus=bus,
        pool=pool,
        background=background,
        disk=disk,
        held=_held(state, overlaps) if settings.merge.hold_overlapping else None,
        # Tasks can appear on their own while beads feeds them: never stop a session as idle.
        more_work_may_arrive=lambda: beads.running,
    )
    notifier = Notifier(
        settings.notifications,
        bus=bus,
        background=background,
        workspace_root=workspace.root,
        path=environ.get("PATH", os.defpath),
        all_done=lambda: all_tasks_done(state),
    )
    conflicts = ConflictPolicy(
        settings=settings.merge, state=state, bus=bus, worktrees=worktrees, questions=questions
    )
    merges = MergeQueue(
        settings=settings.merge,
        state=state,
        bus=bus,
        worktrees=worktrees,
        integration_dir=workspace.grid_dir / "integration",
        policy=conflicts,
        background=background,
        pause=merge_pause,
    )
    commands = Commands(
        settings=settings,
        state=state,
        pool=pool,
        scheduler=scheduler,
        questions=questions,
        merge_gate=merges.gate,
        root=workspace.root,
        worktrees=worktrees,
        ask_sources=beads.ask,
        merge_answers=_merge_answers(background, unresolved=unresolved, conflicts=conflicts),
    )
    return Grid(
        workspace=workspace,
        settings=settings,
        store=store,
        bus=bus,
        background=background,
        disk=disk,
        state=state,
        worktrees=worktrees,
        private=private,
        questions=questions,
        executor=executor,
        pool=pool,
        unresolved=unresolved,
        finisher=finisher,
        events=events,
        scheduler=scheduler,
        beads=beads,
        notifier=notifier,
        conflicts=conflicts,
        merges=merges,
        commands=commands,
        prepared=prepared,
        radar=overlaps,
        store_health=store_health,
        warnings=warnings,
    )


def _held(state: GridState, overlaps: Radar) -> Callable[[], frozenset[str]]:
    """Ready tasks the radar holds back (``[merge] hold_overlapping``)."""
    return lambda: radar.held(state.tasks.values(), overlaps.changed())


def _merge_answers(
    background: Background, *, unresolved: Unresolved, conflicts: ConflictPolicy
) -> Callable[[Question, str], None]:
    """A human's answer to a merge question, delivered to the policy that asked it."""

    def deliver(question: Question, response: str) -> None:
        asker = unresolved if question.type == UNRESOLVED_QUESTION else conflicts
        background.spawn(f"merge-answer:{question.task_id}", asker.answered(question, response))

    return deliver
