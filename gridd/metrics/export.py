"""The Prometheus side of gridd's metrics: a custom collector over the daemon's parts, rendered by
prometheus-client. Imported at the first scrape only (see ``gridd.metrics.feed``).

Gauges are computed here from the state cache; counters and histograms are copied from the
plain state ``EventCounter`` and ``RequestStats`` keep (no prometheus objects are touched
while the daemon works).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gridd import __version__
from gridd.metrics.feed import (
    EVENT_COUNTERS,
    EXIT_OUTCOMES,
    PART_STATES,
    Buckets,
    EventCounter,
    MetricsSource,
    RequestStats,
    supervised_parts,
)
from gridd.model import AgentStatus, TaskStatus, utcnow


def _histogram(name: str, help_: str, buckets: Buckets) -> Metric:
    return HistogramMetricFamily(name, help_, buckets=buckets.cumulative(), sum_value=buckets.total)


def _gauge(name: str, help_: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, help_, labels=list(labels) if labels else None)
    family.add_metric(list(labels.values()) if labels else [], value)
    return family


def _counter(name: str, help_: str, value: float) -> Metric:
    return CounterMetricFamily(name.removesuffix("_total"), help_, value=value)


class GridCollector(Collector):
    """Everything read from the daemon's parts at scrape time (a custom collector: no upkeep)."""

    def __init__(self, grid: MetricsSource, events: EventCounter, requests: RequestStats) -> None:
        self.grid = grid
        self.events = events
        self.requests = requests
        self.parts_seen: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        grid = self.grid
        yield from self._tasks_and_agents()
        yield from self._counters()
        yield from self._histograms()
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

    def _histograms(self) -> Iterator[Metric]:
        events = self.events
        yield _histogram(
            "gridd_task_ready_to_started_seconds",
            "From a task becoming ready to its agent process running",
            events.ready_to_started,
        )
        yield _histogram(
            "gridd_task_result_to_review_seconds",
            "From an agent's exit (its result) to its task in review, work committed",
            events.result_to_review,
        )
        latency = HistogramMetricFamily(
            "gridd_http_request_duration_seconds",
            "API request latency by route template (event streams excluded)",
            labels=["method", "route"],
        )
        for (method, route), buckets in sorted(self.requests.latency.items()):
            latency.add_metric([method, route], buckets.cumulative(), buckets.total)
        yield latency
        codes = CounterMetricFamily(
            "gridd_http_requests",
            "API requests by route template and status code",
            labels=["method", "route", "code"],
        )
        for (method, route, code), count in sorted(self.requests.codes.items()):
            codes.add_metric([method, route, str(code)], count)
        yield codes

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
        by_state = GaugeMetricFamily(
            "gridd_background_part_state",
            "Supervised background parts: 1 for the state each is in",
            labels=["part", "state"],
        )
        for name in sorted(self.parts_seen):
            state = states.get(name, "down")
            parts.add_metric([name], 1 if state == "up" else 0)
            for known in PART_STATES:
                by_state.add_metric([name, known], 1 if state == known else 0)
        yield parts
        yield by_state
        yield _gauge(
            "gridd_background_tasks",
            "Background tasks alive (parts plus per-agent monitors, starts and stops)",
            len(self.grid.background.names),
        )


def _db_size(path: os.PathLike[str] | str) -> int:
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.stat(f"{os.fspath(path)}{suffix}").st_size
        except OSError:
            pass
    return total


def renderer(
    source: MetricsSource, events: EventCounter, requests: RequestStats
) -> Callable[[], bytes]:
    """A per-daemon registry (never the global one) and the function rendering it."""
    # No ``*_created`` series: in the 0.0.4 text format each is one more gauge per
    # counter and histogram, which doubles a scrape for a timestamp the uptime gives.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GridCollector(source, events, requests))
    ProcessCollector(registry=registry)  # RSS, CPU, open and max fds
    return lambda: generate_latest(registry)
