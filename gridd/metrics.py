"""Metrics: what ``GET /metrics`` exports, in Prometheus' text format (prometheus-client).

Two sources, neither of which costs the scheduler anything:

- **Gauges are read at scrape time** from the state cache by ``GridCollector`` (tasks by
  status, agents and the limit, questions, spend and budget, SSE clients, the event log, the
  merge queue, the background parts). Nothing is updated as the state changes.
- **Counters and histograms are fed by the event bus.** ``EventCounter`` is a bus listener:
  one dict lookup per event, a few more for the handful of types it reads (spawns, exits by
  outcome, retries, rate-limit parks, merges, conflicts). It also times ready -> started
  and an agent's exit (its result) -> its task in ``review``.

Every daemon has its own ``CollectorRegistry`` (never the process-global one), so two
daemons in one test process never share a series. Names follow Prometheus conventions: base
units (seconds, bytes, dollars), ``_total`` on counters, and labels only from bounded sets
(statuses, outcomes, event types, route templates, part names), never a task or agent id.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gridd import __version__
from gridd.model import AgentStatus, Event, TaskStatus, utcnow

if TYPE_CHECKING:
    from gridd.service import Grid

#: Ready -> started is spawn latency plus queueing behind the agent limit: ms to hours.
WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
#: Exit -> review is committing and diffing the run's work: usually well under a second.
FINISH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

#: Which event ends a run with which outcome (``gridd_agent_exits_total{outcome}``).
EXIT_OUTCOMES = {
    "agent.completed": "completed",
    "agent.failed": "failed",
    "agent.continued": "continued",
    "agent.stopped": "stopped",
    "task.rate_limited": "rate_limited",
}
#: Plain event counts exported as their own counters: event type -> (name, help).
EVENT_COUNTERS = {
    "agent.spawned": ("gridd_agent_spawns_total", "Agent processes started"),
    "task.start_failed": ("gridd_agent_spawn_failures_total", "Agents that could not start"),
    "task.rate_limited": ("gridd_task_rate_limit_parks_total", "Tasks parked by a usage limit"),
    "agent.question": ("gridd_questions_asked_total", "Questions agents asked a human"),
    "task.merge_queued": ("gridd_merges_queued_total", "Tasks approved into the merge queue"),
    "task.merged": ("gridd_merges_total", "Tasks merged into their feature branch"),
    "task.merge_conflict": ("gridd_merge_conflicts_total", "Merges stopped by a conflict"),
    "task.merge_check_failed": (
        "gridd_merge_check_failures_total",
        "Merges whose check command failed",
    ),
    "task.rejected": ("gridd_task_rejections_total", "Reviews sent back to their agent"),
    "conflict.detected": ("gridd_conflicts_detected_total", "Predicted conflicts between tasks"),
}

F = TypeVar("F", bound=Callable[..., Awaitable[None]])


class EventCounter:
    """A bus listener turning events into counters and the two latency histograms."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.by_type: dict[str, int] = {}
        self.published = 0
        self.retries = 0
        self.ready_at: dict[str, float] = {}  # task id -> monotonic time first seen ready
        self.exited_at: dict[str, float] = {}  # agent id -> monotonic time its process ended
        self.ready_to_started = Histogram(
            "gridd_task_ready_to_started_seconds",
            "From a task becoming ready to its agent process running",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.result_to_review = Histogram(
            "gridd_task_result_to_review_seconds",
            "From an agent's exit (its result) to its task in review, work committed",
            buckets=FINISH_BUCKETS,
            registry=registry,
        )

    def __call__(self, event: Event) -> None:
        self.published += 1
        kind = event.type
        self.by_type[kind] = self.by_type.get(kind, 0) + 1
        if kind == "agent.output":
            return  # the hot path: nothing more to do for output chunks
        if kind == "tasks.changed":
            self._tasks_changed(event.data.get("tasks") or [])
        elif kind == "agent.spawned":
            started = self.ready_at.pop(str(event.data.get("taskId")), None)
            if started is not None:
                self.ready_to_started.observe(time.monotonic() - started)
        elif kind in EXIT_OUTCOMES:
            ended = self.exited_at.pop(str(event.data.get("agentId")), None)
            if kind == "agent.completed" and ended is not None:
                self.result_to_review.observe(time.monotonic() - ended)
            if kind == "agent.failed" and event.data.get("willRetry"):
                self.retries += 1

    def _tasks_changed(self, tasks: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        for task in tasks:
            task_id, status = task.get("id"), task.get("status")
            if status in ("ready", "working"):
                # A task made ready and started in one pass is first seen working: its
                # wait starts there (the spawn is still ahead of it).
                self.ready_at.setdefault(str(task_id), now)
            else:
                self.ready_at.pop(str(task_id), None)

    def timed_exit(self, finish: F) -> F:
        """Wrap the pool's exit callback so an exit's moment is known to the histogram."""

        async def on_exit(agent_id: str, *args: Any, **kwargs: Any) -> None:
            self.exited_at[agent_id] = time.monotonic()
            try:
                await finish(agent_id, *args, **kwargs)
            finally:
                self.exited_at.pop(agent_id, None)  # settled either way: keep it bounded

        return on_exit  # type: ignore[return-value]


def _gauge(name: str, help_: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, help_, labels=list(labels) if labels else None)
    family.add_metric(list(labels.values()) if labels else [], value)
    return family


def _counter(name: str, help_: str, value: float) -> Metric:
    return CounterMetricFamily(name.removesuffix("_total"), help_, value=value)


class GridCollector(Collector):
    """Everything read from the Grid at scrape time (a custom collector: no upkeep)."""

    def __init__(self, grid: Grid, events: EventCounter) -> None:
        self.grid = grid
        self.events = events
        self.parts_seen: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        grid = self.grid
        yield from self._tasks_and_agents()
        yield from self._counters()
        yield from self._questions_and_spend()
        bus, store = grid.bus, grid.store
        yield _gauge("gridd_sse_clients", "Live event-stream subscribers", bus.subscriber_count)
        yield _counter(
            "gridd_sse_clients_dropped_total",
            "Event-stream clients disconnected for falling behind (they resume by id)",
            bus.dropped_total,
        )
        first = store.first_event_id()
        yield _gauge(
            "gridd_event_log_events", "Events retained in the log", bus.last_id - first + 1
        )
        yield _gauge("gridd_event_log_last_id", "The newest event id", bus.last_id)
        yield _gauge("gridd_database_size_bytes", "gridd.db with its WAL", _db_size(store.path))
        yield from self._parts()
        scheduler = grid.scheduler
        yield _counter("gridd_scheduler_passes_total", "Reconcile passes run", scheduler.passes)
        yield _counter(
            "gridd_scheduler_idle_passes_total",
            "Passes skipped because nothing had changed",
            scheduler.idle_passes,
        )
        yield _gauge(
            "gridd_scheduler_last_pass_seconds",
            "Duration of the latest pass",
            scheduler.last_pass_seconds,
        )
        yield _gauge("gridd_uptime_seconds", "Seconds since the daemon started", grid.uptime)
        info = GaugeMetricFamily("gridd_build_info", "The daemon's version", labels=["version"])
        info.add_metric([__version__], 1)
        yield info

    def _tasks_and_agents(self) -> Iterator[Metric]:
        grid = self.grid
        counts = Counter(task.status for task in grid.state.tasks.values())
        tasks = GaugeMetricFamily("gridd_tasks", "Tasks by status", labels=["status"])
        for status in TaskStatus:
            tasks.add_metric([status.value], counts[status])
        yield tasks
        yield _gauge(
            "gridd_merge_queue_depth",
            "Approved tasks queued for, or in, the merge (status merging)",
            counts[TaskStatus.MERGING],
        )
        live = grid.state.live_agents()
        by_status = dict.fromkeys((s.value for s in AgentStatus if s != AgentStatus.EXITED), 0)
        for agent in live:
            by_status[agent.status.value] = by_status.get(agent.status.value, 0) + 1
        agents = GaugeMetricFamily("gridd_agents", "Live agents by status", labels=["status"])
        for agent_status, count in by_status.items():
            agents.add_metric([agent_status], count)
        yield agents
        yield _gauge("gridd_agents_running", "Agents alive (any status but exited)", len(live))
        yield _gauge("gridd_agents_limit", "The session's maxAgents", grid.state.session.max_agents)
        yield _gauge(
            "gridd_agents_starting", "Agents being spawned right now", len(grid.pool.starting)
        )

    def _counters(self) -> Iterator[Metric]:
        events = self.events
        by_type = events.by_type
        for kind, (name, help_) in EVENT_COUNTERS.items():
            yield _counter(name, help_, by_type.get(kind, 0))
        exits = CounterMetricFamily(
            "gridd_agent_exits", "Agent runs ended, by outcome", labels=["outcome"]
        )
        for kind, outcome in EXIT_OUTCOMES.items():
            exits.add_metric([outcome], by_type.get(kind, 0))
        yield exits
        yield _counter(
            "gridd_task_retries_total", "Failed runs that will be retried", events.retries
        )
        yield _counter(
            "gridd_events_published_total", "Events appended to the log", events.published
        )
        by_kind = CounterMetricFamily(
            "gridd_events_by_type", "Events appended to the log, by type", labels=["type"]
        )
        for kind, count in sorted(by_type.items()):
            by_kind.add_metric([kind], count)
        yield by_kind

    def _questions_and_spend(self) -> Iterator[Metric]:
        grid = self.grid
        pending = grid.questions.pending()
        yield _gauge("gridd_questions_pending", "Questions waiting for a human", len(pending))
        oldest = min((q.asked_at for q in pending), default=None)
        age = (utcnow() - oldest).total_seconds() if oldest is not None else 0.0
        yield _gauge(
            "gridd_questions_oldest_age_seconds",
            "How long the oldest pending question has waited (0 when none)",
            max(age, 0.0),
        )
        session = grid.state.session
        live_cost = sum(a.cost_usd or 0.0 for a in grid.state.live_agents())
        yield _gauge(
            "gridd_session_spent_dollars",
            "USD spent by the session: finished runs plus what live ones reported",
            session.spent_usd + live_cost,
        )
        if session.budget_usd is not None:  # absent when explicitly unlimited
            yield _gauge("gridd_session_budget_dollars", "The session's budget", session.budget_usd)
        yield _gauge("gridd_session_active", "1 while a session is started", int(session.started))

    def _parts(self) -> Iterator[Metric]:
        """Each long-running background part: 1 while it runs, 0 once it has stopped."""
        states = supervised_parts(self.grid)
        self.parts_seen.update(states)
        parts = GaugeMetricFamily(
            "gridd_background_part_up",
            "Supervised background parts: 1 running, 0 down or restarting",
            labels=["part"],
        )
        for name in sorted(self.parts_seen):
            parts.add_metric([name], 1 if states.get(name) == "up" else 0)
        yield parts
        yield _gauge(
            "gridd_background_tasks",
            "Background tasks alive (parts plus per-agent watchers, starts and stops)",
            len(self.grid.background.names),
        )


def supervised_parts(grid: Grid) -> dict[str, str]:
    """Long-running part name -> "up". Per-agent tasks (``agent:<id>``) are not parts."""
    return {name: "up" for name in grid.background.names if ":" not in name}


def _db_size(path: os.PathLike[str] | str) -> int:
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.stat(f"{os.fspath(path)}{suffix}").st_size
        except OSError:
            pass
    return total


class DaemonMetrics:
    """One daemon's registry: the event counter, the collector, process metrics."""

    def __init__(self, grid: Grid) -> None:
        # No ``*_created`` series: in the 0.0.4 text format each is one more gauge per
        # counter and histogram, which doubles a scrape for a timestamp the uptime gives.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=False)
        self.events = EventCounter(self.registry)
        self.registry.register(GridCollector(grid, self.events))
        ProcessCollector(registry=self.registry)  # RSS, CPU, open and max fds
        grid.bus.add_listener(self.events)

    def render(self) -> bytes:
        return generate_latest(self.registry)
