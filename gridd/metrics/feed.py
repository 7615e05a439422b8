"""Metrics: what ``GET /metrics`` exports, in Prometheus' text format (prometheus-client).

Two sources, neither of which costs the scheduler anything:

- **Gauges are read at scrape time** from the state cache by ``GridCollector`` (tasks by
  status, agents and the limit, questions, spend and budget, SSE clients, the event log, the
  merge queue, the background parts). Nothing is updated as the state changes.
- **Counters and histograms are fed by the event bus.** ``EventCounter`` is a bus listener:
  one dict lookup per event, a few more for the handful of types it reads (spawns, exits by
  outcome, retries, rate-limit parks, merges, conflicts). It also times ready -> started
  and an agent's exit (its result) -> its task in ``review``.

Both read a ``MetricsSource``: the daemon's parts, not the ``Grid`` (which satisfies it).
``DaemonMetrics`` (``metrics.daemon``) holds one daemon's counter and request stats and
renders them; prometheus-client itself is imported at the first scrape (``metrics.export``), not at
start-up: a daemon nobody scrapes never pays for it. Every daemon has its own
``CollectorRegistry`` (never the process-global one), so two
daemons in one test process never share a series. Names follow Prometheus conventions: base
units (seconds, bytes, dollars), ``_total`` on counters, and labels only from bounded sets
(statuses, outcomes, event types, route templates, part names), never a task or agent id.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gridd.model import Event

if TYPE_CHECKING:
    from gridd.background import Background
    from gridd.events import EventBus
    from gridd.pool import AgentPool
    from gridd.questions import QuestionBook
    from gridd.scheduler import Scheduler
    from gridd.state import GridState
    from gridd.store import Store


class MetricsSource(Protocol):
    """What the metrics read at scrape time: the daemon's parts. The ``Grid`` satisfies it;
    metrics never import the Grid."""

    @property
    def bus(self) -> EventBus: ...
    @property
    def store(self) -> Store: ...
    @property
    def state(self) -> GridState: ...
    @property
    def pool(self) -> AgentPool: ...
    @property
    def questions(self) -> QuestionBook: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def background(self) -> Background: ...
    @property
    def uptime(self) -> float: ...


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
    "merge.batch_started": ("gridd_merge_gate_runs_total", "Merge train candidates gated"),
    "merge.batch_failed": ("gridd_merge_gate_failures_total", "Merge train candidates that failed"),
    "task.rejected": ("gridd_task_rejections_total", "Reviews sent back to their agent"),
    "conflict.detected": ("gridd_conflicts_detected_total", "Predicted conflicts between tasks"),
}

#: The states a supervised part can be in (``gridd_background_part_state``).
PART_STATES = ("up", "restarting", "down")

F = TypeVar("F", bound=Callable[..., Awaitable[None]])


class Buckets:
    """A histogram's state (Prometheus' cumulative buckets are made from it at scrape)."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


#: API request latency buckets (seconds).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class RequestStats:
    """Requests by (method, route template) and status: plain counts, exported at scrape."""

    def __init__(self) -> None:
        self.latency: dict[tuple[str, str], Buckets] = {}
        self.codes: dict[tuple[str, str, int], int] = {}

    def record(self, method: str, route: str, status: int, seconds: float | None) -> None:
        if seconds is not None:
            timer = self.latency.get((method, route))
            if timer is None:
                timer = self.latency[(method, route)] = Buckets(LATENCY_BUCKETS)
            timer.observe(seconds)
        key = (method, route, status)
        self.codes[key] = self.codes.get(key, 0) + 1


class EventCounter:
    """A bus listener turning events into counters and the two latency histograms."""

    def __init__(self) -> None:
        self.by_type: dict[str, int] = {}
        self.published = 0
        self.retries = 0
        self.ready_at: dict[str, float] = {}  # task id -> monotonic time first seen ready
        self.exited_at: dict[str, float] = {}  # agent id -> monotonic time its process ended
        self.ready_to_started = Buckets(WAIT_BUCKETS)
        self.result_to_review = Buckets(FINISH_BUCKETS)

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


def supervised_parts(grid: MetricsSource) -> dict[str, str]:
    """Part name -> state ("up", "restarting", "down").

    From the Grid's supervisor when it has one (``states()`` or ``parts``: a mapping of
    name to a state string, or to an object with a ``state``); otherwise every named
    long-running background task is "up" (per-agent tasks, ``agent:<id>``, are not parts).
    """
    supervisor: Any = getattr(grid, "supervisor", None)
    raw: Any = None
    if supervisor is not None:
        states = getattr(supervisor, "states", None)
        raw = states() if callable(states) else getattr(supervisor, "parts", None)
    if isinstance(raw, dict):
        found = {}
        for name, value in raw.items():
            state = value if isinstance(value, str) else getattr(value, "state", value)
            found[str(name)] = str(getattr(state, "value", state))
        return found
    return {name: "up" for name in grid.background.names if ":" not in name}
