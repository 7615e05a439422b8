"""The pure planner: the task graph, readiness, waves and ``plan(observed) -> actions``.

No daemon, no processes, no clock: every input is built here.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from gridd.model import Task, TaskStatus
from gridd.plan import (
    Action,
    AgentView,
    Observed,
    SetStatus,
    StartTask,
    StopAgent,
    StopSession,
    find_cycle,
    graph_problems,
    plan,
    readiness,
    waves,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = 1000.0


def task(
    task_id: str,
    status: TaskStatus = TaskStatus.READY,
    *,
    deps: Sequence[str] = (),
    priority: int = 2,
    age: int = 0,
    agent: str | None = None,
    error: str | None = None,
) -> Task:
    """A task created ``age`` seconds after T0 (larger age = younger)."""
    return Task(
        id=task_id,
        title=task_id,
        status=status,
        depends_on=list(deps),
        priority=priority,
        created_at=T0 + timedelta(seconds=age),
        agent=agent,
        error=error,
    )


def agent(
    task_id: str,
    *,
    profile: str = "example",
    started: float = NOW - 1,
    stopping: bool = False,
) -> AgentView:
    return AgentView(
        id=f"agent-{task_id}",
        task_id=task_id,
        profile=profile,
        started=started,
        stopping=stopping,
    )


def observed(tasks: Sequence[Task], **kwargs: object) -> Observed:
    defaults: dict[str, object] = {
        "now": NOW,
        "session_started": True,
        "max_agents": 10,
        "agents": [],
    }
    return Observed(tasks=list(tasks), **{**defaults, **kwargs})  # type: ignore[arg-type]


def started_ids(actions: Sequence[Action]) -> list[str]:
    return [a.task_id for a in actions if isinstance(a, StartTask)]


# -- the graph -------------------------------------------------------------------------------


def test_waves_are_topological_levels_sorted_within_a_wave() -> None:
    graph = {"c": ["a", "b"], "a": [], "b": ["a"], "d": [], "e": ["d", "a"]}
    assert waves(graph) == [["a", "d"], ["b", "e"], ["c"]]


def test_waves_of_an_empty_graph_are_empty() -> None:
    assert waves({}) == []


def test_waves_of_a_random_dag_put_each_task_one_wave_after_its_latest_dependency() -> None:
    rng = random.Random(7)
    ids = [f"t{i:04d}" for i in range(2000)]
    graph = {tid: rng.sample(ids[:i], k=min(i, rng.randint(0, 3))) for i, tid in enumerate(ids)}
    level = {tid: w for w, wave in enumerate(waves(graph)) for tid in wave}
    assert sorted(level) == sorted(ids)
    for tid, deps in graph.items():
        assert level[tid] == 1 + max((level[d] for d in deps), default=-1)


def test_find_cycle_names_the_ids_along_the_cycle() -> None:
    graph = {"a": ["c"], "b": ["a"], "c": ["b"], "x": [], "y": ["x"]}
    cycle = find_cycle(graph)
    assert cycle is not None
    assert sorted(cycle) == ["a", "b", "c"]
    # Each id on the cycle depends on the next one (wrapping around).
    for i, node in enumerate(cycle):
        assert cycle[(i + 1) % len(cycle)] in graph[node]


def test_find_cycle_is_none_for_a_dag() -> None:
    assert find_cycle({"a": [], "b": ["a"], "c": ["a", "b"]}) is None


def test_find_cycle_survives_a_very_long_chain() -> None:
    # Iterative, not recursive: 50,000 deep must not hit the recursion limit.
    n = 50_000
    graph = {f"t{i}": [f"t{i + 1}"] if i + 1 < n else [] for i in range(n)}
    assert find_cycle(graph) is None
    graph[f"t{n - 1}"] = ["t0"]
    cycle = find_cycle(graph)
    assert cycle is not None and len(cycle) == n


def test_graph_problems_names_a_cycle_through_existing_tasks() -> None:
    problems = graph_problems([("new", ["old"])], {"old": ["new"]})
    assert [p.kind for p in problems] == ["cycle"]
    assert "new" in problems[0].message and "old" in problems[0].message


def test_graph_problems_names_unknown_dependencies_duplicates_and_self_dependencies() -> None:
    problems = graph_problems(
        [("a", ["ghost"]), ("b", ["b"]), ("c", []), ("c", [])], {"existing": []}
    )
    kinds = {p.kind: p for p in problems}
    assert set(kinds) == {"unknown_dependency", "self_dependency", "duplicate"}
    assert "ghost" in kinds["unknown_dependency"].message
    assert "'b'" in kinds["self_dependency"].message
    assert "'c'" in kinds["duplicate"].message


def test_graph_problems_reports_a_cycle_alongside_the_other_problems() -> None:
    problems = graph_problems([("a", ["b", "ghost"]), ("b", ["a"]), ("c", ["c"])])
    assert [(p.kind, p.ids) for p in problems] == [
        ("unknown_dependency", ("a", "ghost")),
        ("self_dependency", ("c",)),  # not also a cycle of one
        ("cycle", ("a", "b")),
    ]


def test_graph_problems_flags_an_id_that_already_exists() -> None:
    problems = graph_problems([("old", [])], {"old": []})
    assert [(p.kind, p.ids) for p in problems] == [("duplicate", ("old",))]


def test_graph_problems_accepts_dependencies_on_existing_tasks() -> None:
    assert graph_problems([("b", ["a"]), ("c", ["b", "a"])], {"a": []}) == []


# -- readiness -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dep_statuses", "expected"),
    [
        ([], TaskStatus.READY),
        ([TaskStatus.DONE, TaskStatus.DONE], TaskStatus.READY),
        ([TaskStatus.DONE, TaskStatus.REVIEW], TaskStatus.PENDING),  # review is not done
        ([TaskStatus.WORKING], TaskStatus.PENDING),
        ([TaskStatus.DONE, TaskStatus.FAILED], TaskStatus.BLOCKED),
        ([TaskStatus.CANCELLED], TaskStatus.BLOCKED),
    ],
)
def test_readiness_follows_the_dependencies(
    dep_statuses: list[TaskStatus], expected: TaskStatus
) -> None:
    deps = [f"d{i}" for i in range(len(dep_statuses))]
    t = task("t", TaskStatus.PENDING, deps=deps)
    assert readiness(t, dict(zip(deps, dep_statuses, strict=True))) == expected


def test_readiness_leaves_started_and_finished_tasks_alone() -> None:
    for status in (TaskStatus.WORKING, TaskStatus.REVIEW, TaskStatus.DONE, TaskStatus.FAILED):
        assert readiness(task("t", status, deps=["d"]), {"d": TaskStatus.FAILED}) is None


def test_a_block_caused_by_a_dependency_lifts_when_the_dependency_recovers() -> None:
    blocked = task("t", TaskStatus.BLOCKED, deps=["d"], error="dependency d did not finish")
    assert readiness(blocked, {"d": TaskStatus.READY}) == TaskStatus.PENDING
    assert readiness(blocked, {"d": TaskStatus.FAILED}) is None


def test_a_block_set_by_a_human_does_not_lift_by_itself() -> None:
    blocked = task("t", TaskStatus.BLOCKED, deps=["d"], error="agent killed by user")
    assert readiness(blocked, {"d": TaskStatus.DONE}) is None


def test_plan_marks_dependants_ready_pending_or_blocked() -> None:
    tasks = [
        task("done", TaskStatus.DONE),
        task("failed", TaskStatus.FAILED),
        task("waiting", TaskStatus.READY),
        task("unblocked", TaskStatus.PENDING, deps=["done"]),
        task("stuck", TaskStatus.PENDING, deps=["done", "failed"]),
        task("not-yet", TaskStatus.READY, deps=["waiting"]),
    ]
    actions = plan(observed(tasks, session_started=False))
    changes = {a.task_id: a for a in actions if isinstance(a, SetStatus)}
    assert changes["unblocked"].status == TaskStatus.READY
    assert changes["stuck"].status == TaskStatus.BLOCKED
    assert changes["stuck"].reason is not None and "failed" in changes["stuck"].reason
    assert changes["not-yet"].status == TaskStatus.PENDING
    assert "waiting" not in changes


def test_a_task_made_ready_in_a_pass_starts_in_the_same_pass() -> None:
    tasks = [task("dep", TaskStatus.DONE), task("t", TaskStatus.PENDING, deps=["dep"])]
    actions = plan(observed(tasks))
    assert actions == [SetStatus("t", TaskStatus.READY), StartTask("t", "example")]


# -- starting ------------------------------------------------------------------------------


def test_nothing_starts_without_a_session() -> None:
    assert started_ids(plan(observed([task("a"), task("b")], session_started=False))) == []


def test_ready_tasks_start_by_priority_then_age_then_id() -> None:
    tasks = [
        task("late-urgent", priority=0, age=50),
        task("old-normal", priority=2, age=0),
        task("young-normal", priority=2, age=10),
        task("early-urgent", priority=0, age=5),
        task("b-tie", priority=1, age=3),
        task("a-tie", priority=1, age=3),
        task("low", priority=4, age=-100),
    ]
    assert started_ids(plan(observed(tasks))) == [
        "early-urgent",
        "late-urgent",
        "a-tie",
        "b-tie",
        "old-normal",
        "young-normal",
        "low",
    ]


def test_max_agents_caps_starts_counting_running_and_starting_agents() -> None:
    tasks = [task(f"t{i}", age=i) for i in range(6)]
    tasks[0] = task("t0", TaskStatus.WORKING)
    obs = observed(tasks, max_agents=3, agents=[agent("t0")], starting=frozenset({"t1"}))
    # t0 runs, t1 is being started: one slot left, for the oldest ready task.
    assert started_ids(plan(obs)) == ["t2"]


def test_no_start_once_max_agents_are_running() -> None:
    tasks = [task("w1", TaskStatus.WORKING), task("w2", TaskStatus.WORKING), task("r")]
    obs = observed(tasks, max_agents=2, agents=[agent("w1"), agent("w2")])
    assert plan(obs) == []


def test_an_exited_agent_whose_work_is_being_committed_frees_its_slot() -> None:
    # w1's agent has exited and its finish (git commit) runs: its slot goes to r, but w1
    # itself gets no second agent while its work is being recorded.
    tasks = [task("w1", TaskStatus.WORKING), task("w2", TaskStatus.WORKING), task("r")]
    obs = observed(
        tasks,
        max_agents=2,
        agents=[agent("w1"), agent("w2")],
        starting=frozenset({"w1"}),
        finishing=frozenset({"w1"}),
    )
    assert started_ids(plan(obs)) == ["r"]


def test_a_stopping_agent_still_occupies_its_slot() -> None:
    # The agent is on its way out but alive: starting another would exceed maxAgents.
    tasks = [task("old", TaskStatus.READY), task("new", age=1)]
    obs = observed(tasks, max_agents=1, agents=[agent("old", stopping=True)])
    assert started_ids(plan(obs)) == []


def test_per_profile_concurrency_limits_starts_but_not_other_profiles() -> None:
    tasks = [
        task("c1", agent="claude", age=1),
        task("c2", agent="claude", age=2),
        task("c3", agent="claude", age=3),
        task("e1", age=4),
        task("e2", age=5),
    ]
    obs = observed(tasks, max_agents=10, profile_limits={"claude": 2, "example": 1})
    assert started_ids(plan(obs)) == ["c1", "c2", "e1"]


def test_per_profile_limit_counts_running_agents() -> None:
    tasks = [task("c1", TaskStatus.WORKING, agent="claude"), task("c2", agent="claude"), task("e")]
    obs = observed(tasks, profile_limits={"claude": 1}, agents=[agent("c1", profile="claude")])
    assert started_ids(plan(obs)) == ["e"]


def test_per_profile_limit_counts_agents_still_being_started() -> None:
    # c1's spawn is in flight (worktree being created): it already uses the profile's slot.
    tasks = [task("c1", TaskStatus.WORKING, agent="claude"), task("c2", agent="claude", age=1)]
    obs = observed(tasks, profile_limits={"claude": 1}, starting=frozenset({"c1"}))
    assert started_ids(plan(obs)) == []


def test_tasks_without_an_agent_profile_use_the_default_profile() -> None:
    obs = observed([task("t"), task("u", agent="claude", age=1)], default_profile="codex")
    starts = [a for a in plan(obs) if isinstance(a, StartTask)]
    assert starts == [StartTask("t", "codex"), StartTask("u", "claude")]


def test_explicit_starts_ignore_the_session_and_its_limits() -> None:
    # A working task without an agent was started by hand (POST /tasks/{id}/start).
    tasks = [
        task("busy", TaskStatus.WORKING, agent="claude"),
        task("manual", TaskStatus.WORKING, agent="claude", age=1),
    ]
    for session_started in (False, True):
        obs = observed(
            tasks,
            session_started=session_started,
            max_agents=1,
            agents=[agent("busy", profile="claude")],
            profile_limits={"claude": 1},
        )
        assert plan(obs) == [StartTask("manual", "claude")]


def test_explicit_starts_go_before_session_starts_and_use_up_slots() -> None:
    tasks = [task("ready", age=0), task("manual", TaskStatus.WORKING, age=5)]
    actions = plan(observed(tasks, max_agents=1))
    assert started_ids(actions) == ["manual"]


def test_a_task_with_an_agent_or_a_start_in_flight_is_not_started_again() -> None:
    tasks = [task("running", TaskStatus.WORKING), task("starting", TaskStatus.WORKING)]
    obs = observed(tasks, agents=[agent("running")], starting=frozenset({"starting"}))
    assert plan(obs) == []


def test_backoff_delays_a_retry_until_not_before() -> None:
    tasks = [task("retry"), task("manual", TaskStatus.WORKING, age=1)]
    waiting = {"retry": NOW + 0.5, "manual": NOW + 0.5}
    assert plan(observed(tasks, not_before=waiting)) == []
    later = observed(tasks, not_before=waiting, now=NOW + 0.6)
    assert started_ids(plan(later)) == ["manual", "retry"]


def test_a_backing_off_task_does_not_hold_a_slot() -> None:
    tasks = [task("retry", age=0), task("other", age=1)]
    obs = observed(tasks, max_agents=1, not_before={"retry": NOW + 10})
    assert started_ids(plan(obs)) == ["other"]


# -- stopping ------------------------------------------------------------------------------


def test_agents_whose_task_no_longer_works_are_stopped() -> None:
    tasks = [task("cancelled", TaskStatus.CANCELLED), task("ready", TaskStatus.READY)]
    agents = [agent("cancelled"), agent("ready"), agent("vanished")]
    stops = [a for a in plan(observed(tasks, agents=agents)) if isinstance(a, StopAgent)]
    assert {s.task_id for s in stops} == {"cancelled", "ready", "vanished"}


def test_an_agent_already_stopping_is_not_stopped_again() -> None:
    obs = observed([task("t", TaskStatus.READY)], agents=[agent("t", stopping=True)])
    assert [a for a in plan(obs) if isinstance(a, StopAgent)] == []


def test_an_agent_past_its_timeout_is_stopped_and_one_within_it_is_not() -> None:
    tasks = [task("slow", TaskStatus.WORKING), task("fresh", TaskStatus.WORKING)]
    agents = [agent("slow", started=NOW - 31), agent("fresh", started=NOW - 29)]
    obs = observed(tasks, agents=agents, timeouts={"slow": 30.0, "fresh": 30.0})
    stops = [a for a in plan(obs) if isinstance(a, StopAgent)]
    assert [(s.task_id, s.reason) for s in stops] == [("slow", "timeout after 30s")]


def test_an_agent_without_a_timeout_runs_forever() -> None:
    obs = observed([task("t", TaskStatus.WORKING)], agents=[agent("t", started=NOW - 1e6)])
    assert plan(obs) == []


def test_stops_come_before_status_changes_and_status_changes_before_starts() -> None:
    tasks = [
        task("dep", TaskStatus.DONE),
        task("gone", TaskStatus.CANCELLED),
        task("next", TaskStatus.PENDING, deps=["dep"], age=1),
        task("ready", age=2),
    ]
    actions = plan(observed(tasks, agents=[agent("gone")]))
    kinds = [type(a).__name__ for a in actions]
    assert kinds == ["StopAgent", "SetStatus", "StartTask", "StartTask"]
    last_stop = max(i for i, a in enumerate(actions) if isinstance(a, StopAgent | StopSession))
    first_start = min(i for i, a in enumerate(actions) if isinstance(a, StartTask))
    assert last_stop < first_start


# -- the stop file ---------------------------------------------------------------------------


def test_the_stop_file_stops_the_session_and_starts_nothing_new() -> None:
    obs = observed([task("a"), task("b")], stop_file=True)
    assert plan(obs) == [StopSession("stop_file")]


def test_the_stop_file_without_a_session_does_nothing() -> None:
    assert plan(observed([task("a")], stop_file=True, session_started=False)) == []


def test_plan_is_deterministic_and_leaves_its_input_alone() -> None:
    tasks = [task(f"t{i}", age=i % 3, priority=i % 5) for i in range(50)]
    obs = observed(tasks, max_agents=7)
    before = [t.model_copy() for t in tasks]
    assert plan(obs) == plan(obs)
    assert tasks == before
