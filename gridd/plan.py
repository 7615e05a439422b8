"""PURE decisions: the task graph, readiness, waves, and ``plan(observed) -> actions``.

No asyncio, no subprocess, no psutil, no clock: everything the decision needs arrives in
``Observed`` (including ``now``), and the result is a list of idempotent actions that the
scheduler applies in order: stops first, then status changes, then starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gridd.model import Task, TaskStatus

#: The reason a rate-limited task is ready again (its next agent is told so).
RATE_LIMIT_RESET = "rate limit reset"

# -- the graph ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphProblem:
    kind: str  # "duplicate" | "unknown_dependency" | "cycle" | "self_dependency"
    message: str
    ids: tuple[str, ...]


def graph_problems(
    new: Sequence[tuple[str, Sequence[str]]], existing: Mapping[str, Sequence[str]] | None = None
) -> list[GraphProblem]:
    """Check a batch of ``(id, depends_on)`` against itself and the existing graph: every
    problem, a cycle among the others (a self-dependency is reported as that, not also as
    a cycle; an unknown dependency is no edge)."""
    existing = existing or {}
    problems: list[GraphProblem] = []
    seen: set[str] = set()
    for task_id, _deps in new:
        if task_id in seen or task_id in existing:
            problems.append(GraphProblem("duplicate", f"duplicate task id {task_id!r}", (task_id,)))
        seen.add(task_id)
    graph: dict[str, Sequence[str]] = {**existing, **dict(new)}
    for task_id, deps in new:
        for dep in deps:
            if dep == task_id:
                problems.append(
                    GraphProblem(
                        "self_dependency", f"task {task_id!r} depends on itself", (task_id,)
                    )
                )
            elif dep not in graph:
                problems.append(
                    GraphProblem(
                        "unknown_dependency",
                        f"task {task_id!r} depends on unknown task {dep!r}",
                        (task_id, dep),
                    )
                )
    without_self = {task_id: [dep for dep in deps if dep != task_id] for task_id, deps in new}
    cycle = find_cycle({**graph, **without_self})
    if cycle:
        path = " -> ".join([*cycle, cycle[0]])
        problems.append(GraphProblem("cycle", f"dependency cycle: {path}", tuple(cycle)))
    return problems


def find_cycle(graph: Mapping[str, Sequence[str]]) -> list[str] | None:
    """One dependency cycle, as the list of ids along it, or None (iterative DFS)."""
    white, grey, black = 0, 1, 2
    color: dict[str, int] = dict.fromkeys(graph, white)
    for root in graph:
        if color[root] != white:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        color[root] = grey
        path.append(root)
        while stack:
            node, index = stack[-1]
            deps = [d for d in graph.get(node, ()) if d in graph]
            if index < len(deps):
                stack[-1] = (node, index + 1)
                dep = deps[index]
                if color[dep] == grey:
                    return path[path.index(dep) :]
                if color[dep] == white:
                    color[dep] = grey
                    stack.append((dep, 0))
                    path.append(dep)
            else:
                color[node] = black
                stack.pop()
                path.pop()
    return None


def waves(graph: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """Topological levels: wave 0 has no dependencies, wave n depends only on earlier ones.

    The graph must be acyclic (check with ``find_cycle`` first). Ids inside a wave are sorted.
    """
    level: dict[str, int] = {}
    order = _topological(graph)
    for node in order:
        deps = [d for d in graph.get(node, ()) if d in graph]
        level[node] = 1 + max((level[d] for d in deps), default=-1)
    result: list[list[str]] = [[] for _ in range(1 + max(level.values(), default=-1))]
    for node, lvl in level.items():
        result[lvl].append(node)
    return [sorted(w) for w in result]


def _topological(graph: Mapping[str, Sequence[str]]) -> list[str]:
    indegree = {n: 0 for n in graph}
    dependants: dict[str, list[str]] = {n: [] for n in graph}
    for node, deps in graph.items():
        for dep in deps:
            if dep in graph:
                indegree[node] += 1
                dependants[dep].append(node)
    ready = [n for n, d in indegree.items() if d == 0]
    order: list[str] = []
    while ready:
        node = ready.pop()
        order.append(node)
        for child in dependants[node]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    return order


# -- readiness --------------------------------------------------------------------------------

_WAITING = frozenset({TaskStatus.PENDING, TaskStatus.READY})
_DEAD_DEPS = frozenset({TaskStatus.FAILED, TaskStatus.CANCELLED})


def readiness(task: Task, statuses: Mapping[str, TaskStatus]) -> TaskStatus | None:
    """The status a waiting task should have given its dependencies (None: leave it)."""
    if task.status not in _WAITING and task.status != TaskStatus.BLOCKED:
        return None
    dep_statuses = [statuses.get(d) for d in task.depends_on]
    if task.status == TaskStatus.BLOCKED:
        # Only a block caused by a dead dependency lifts itself.
        if (
            task.error
            and task.error.startswith("dependency ")
            and not any(s in _DEAD_DEPS for s in dep_statuses)
        ):
            return TaskStatus.PENDING
        return None
    if any(s in _DEAD_DEPS for s in dep_statuses):
        return TaskStatus.BLOCKED
    if all(s == TaskStatus.DONE for s in dep_statuses):
        return TaskStatus.READY
    return TaskStatus.PENDING


def undone_dependencies(task: Task, statuses: Mapping[str, TaskStatus]) -> list[str]:
    return [d for d in task.depends_on if statuses.get(d) != TaskStatus.DONE]


# -- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentView:
    """What the planner needs to know about a live agent."""

    id: str
    task_id: str
    profile: str
    started: float  # monotonic seconds
    stopping: bool = False  # a stop is in flight in this daemon
    intent: str | None = None  # recorded: "stop" or "kill"
    stop_reason: str | None = None
    killing: bool = False  # the stop in flight is a kill


@dataclass(frozen=True)
class Observed:
    now: float  # monotonic seconds: backoff and timeouts never jump with the wall clock
    session_started: bool
    max_agents: int
    tasks: Sequence[Task]
    agents: Sequence[AgentView]
    starting: frozenset[str] = frozenset()  # task ids whose spawn (or finish) is in flight
    not_before: Mapping[str, float] = field(default_factory=dict)  # backoff per task
    profile_limits: Mapping[str, int] = field(default_factory=dict)  # concurrency per profile
    default_profile: str = "example"
    stop_file: bool = False
    timeouts: Mapping[str, float] = field(default_factory=dict)  # task id -> seconds
    wall_now: float = 0.0  # epoch seconds, only for provider reset times (rate limits)
    auto_resume: bool = True
    budget_left: float | None = None  # USD the session may still spend; None: no cap
    estimates: Mapping[str, float] = field(default_factory=dict)  # USD per session, by profile
    stop_when_idle: bool = False  # stop the session (no_work) once every task has settled
    #: Task ids whose agent has exited and whose work is being committed: no new agent for
    #: them yet, but their slot is free (the commit is git's work, not an agent's).
    finishing: frozenset[str] = frozenset()
    held: frozenset[str] = frozenset()  # ready tasks the conflict radar holds back


@dataclass(frozen=True)
class StopAgent:
    agent_id: str
    task_id: str
    reason: str
    force: bool = False


@dataclass(frozen=True)
class SetStatus:
    task_id: str
    status: TaskStatus
    reason: str | None = None


@dataclass(frozen=True)
class StartTask:
    task_id: str
    profile: str


@dataclass(frozen=True)
class StopSession:
    reason: str


Action = StopAgent | SetStatus | StartTask | StopSession


def start_order(task: Task) -> tuple[int, datetime, str]:
    """The order ready tasks start in: priority, then age, then id."""
    return (task.priority, task.created_at, task.id)


def plan(obs: Observed) -> list[Action]:
    """Converge what runs with what should run. Stops first, then statuses, then starts."""
    stops: list[Action] = []
    changes: list[Action] = []
    starts: list[Action] = []
    by_id = {t.id: t for t in obs.tasks}
    statuses = {t.id: t.status for t in obs.tasks}

    if obs.stop_file and obs.session_started:
        stops.append(StopSession("stop_file"))

    # 1. agents someone asked to stop or kill (intent recorded, not yet carried out), whose
    #    task no longer wants them, or that ran past their timeout
    for agent in obs.agents:
        if agent.intent == "kill" and not agent.killing:
            stops.append(StopAgent(agent.id, agent.task_id, agent.stop_reason or "kill", True))
            continue
        if agent.stopping:
            continue
        if agent.intent is not None:
            stops.append(StopAgent(agent.id, agent.task_id, agent.stop_reason or "stop"))
            continue
        task = by_id.get(agent.task_id)
        if task is None or task.status != TaskStatus.WORKING:
            stops.append(StopAgent(agent.id, agent.task_id, "task no longer working"))
            continue
        limit = obs.timeouts.get(task.id)
        if limit is not None and obs.now - agent.started > limit:
            stops.append(StopAgent(agent.id, agent.task_id, f"timeout after {limit:g}s"))

    # 2. readiness follows dependencies
    for task in obs.tasks:
        wanted = readiness(task, statuses)
        if wanted is not None and wanted != task.status:
            reason = None
            if wanted == TaskStatus.BLOCKED:
                dead = [d for d in task.depends_on if statuses.get(d) in _DEAD_DEPS]
                reason = f"dependency {', '.join(dead)} did not finish"
            changes.append(SetStatus(task.id, wanted, reason))
            statuses[task.id] = wanted

    # 2b. a rate-limited task resumes once its provider's limit has reset
    if obs.auto_resume:
        for task in obs.tasks:
            if (
                task.status == TaskStatus.RATE_LIMITED
                and task.resume_at is not None
                and task.resume_at.timestamp() <= obs.wall_now
            ):
                changes.append(SetStatus(task.id, TaskStatus.READY, RATE_LIMIT_RESET))
                statuses[task.id] = TaskStatus.READY

    # 3. starts: working tasks without an agent (explicit starts, crash leftovers) first,
    #    then ready tasks while the session has room.
    busy = {a.task_id for a in obs.agents} | set(obs.starting)

    def profile_of(task: Task) -> str:
        return task.agent or obs.default_profile

    per_profile: dict[str, int] = {}
    for agent in obs.agents:
        if agent.task_id not in obs.finishing:
            per_profile[agent.profile] = per_profile.get(agent.profile, 0) + 1
    # A spawn in flight already holds its profile's slot (its agent does not exist yet).
    with_agent = {a.task_id for a in obs.agents}
    for task_id in obs.starting:
        if task_id not in with_agent and task_id not in obs.finishing and task_id in by_id:
            profile = profile_of(by_id[task_id])
            per_profile[profile] = per_profile.get(profile, 0) + 1

    def profile_has_room(profile: str) -> bool:
        limit = obs.profile_limits.get(profile)
        return limit is None or per_profile.get(profile, 0) < limit

    def backing_off(task: Task) -> bool:
        until = obs.not_before.get(task.id)
        return until is not None and until > obs.now

    for task in sorted(obs.tasks, key=start_order):
        if task.status == TaskStatus.WORKING and task.id not in busy and not backing_off(task):
            profile = profile_of(task)
            starts.append(StartTask(task.id, profile))
            busy.add(task.id)
            per_profile[profile] = per_profile.get(profile, 0) + 1

    budget_blocked = False
    if obs.session_started and not obs.stop_file:
        running = len(busy - obs.finishing)
        left = obs.budget_left
        for task in sorted(obs.tasks, key=start_order):
            if running >= obs.max_agents:
                break
            if statuses.get(task.id) != TaskStatus.READY or task.id in busy or backing_off(task):
                continue
            if task.id in obs.held:
                continue  # its declared files overlap a live task's: it waits for that merge
            profile = profile_of(task)
            if not profile_has_room(profile):
                continue
            if left is not None:
                estimate = obs.estimates.get(profile, 0.0)
                if estimate > left + 1e-9:
                    budget_blocked = True  # start nothing more; running agents finish
                    break
                left -= estimate
            starts.append(StartTask(task.id, profile))
            busy.add(task.id)
            per_profile[profile] = per_profile.get(profile, 0) + 1
            running += 1
        idle = not busy and not starts
        if idle and budget_blocked:
            stops.append(StopSession("budget_exhausted"))
        elif (
            idle
            and obs.stop_when_idle
            and obs.tasks
            and not any(statuses[t.id] in _ACTIVE for t in obs.tasks)
        ):
            stops.append(StopSession("no_work"))
    return [*stops, *changes, *starts]


#: While any task is in one of these, a session still has (or will have) work.
_ACTIVE = frozenset(
    {
        TaskStatus.PENDING,
        TaskStatus.READY,
        TaskStatus.WORKING,
        TaskStatus.RATE_LIMITED,
        TaskStatus.MERGING,  # a merge may send it back to its agent
    }
)


def ready_ids(tasks: Iterable[Task]) -> list[str]:
    return [t.id for t in sorted(tasks, key=start_order) if t.status == TaskStatus.READY]
