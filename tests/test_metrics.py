"""``GET /metrics``: Prometheus text that parses, counters that move with real work, labels
that stay bounded, a registry per daemon, and ``gridctl metrics`` printing it readably."""

from __future__ import annotations

from pathlib import Path

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from gridd.client import GridClient
from tests.support.api import wait_task_status
from tests.support.cli import gridctl
from tests.support.daemons import core_daemon
from tests.support.repos import agent_command, write_core_config
from tests.support.waits import wait_for


def scrape(c: GridClient) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample by name, then by its sorted label pairs."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(c.get_text("/metrics")):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


def one(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str
) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def test_metrics_parse_and_counters_move_with_real_work(repo: Path) -> None:
    write_core_config(
        repo,
        agents={
            "work": {"command": agent_command("trivial.py", "0.3")},
            "bad": {"command": agent_command("fail.py", "3")},
        },
        scheduler={"default_agent": "work"},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        before = scrape(c)
        assert one(before, "gridd_agent_spawns_total") == 0
        assert one(before, "gridd_tasks", status="ready") == 0
        assert one(before, "gridd_agents_limit") == 3

        c.post(
            "/plans",
            {
                "tasks": [
                    {"id": "t1", "title": "one"},
                    {"id": "t2", "title": "two"},
                    {"id": "t3", "title": "fails", "agent": "bad", "maxAttempts": 2},
                ]
            },
        )
        c.post("/session/start", {"featureBranch": "feature/m", "maxAgents": 2})
        for tid in ("t1", "t2"):
            wait_task_status(c, tid, "review")
        wait_task_status(c, "t3", "failed")
        c.get("/tasks/t1")
        c.get("/tasks/t2")

        after = scrape(c)
        assert one(after, "gridd_agent_spawns_total") == 4  # t1, t2, t3 twice
        assert one(after, "gridd_agent_exits_total", outcome="completed") == 2
        assert one(after, "gridd_agent_exits_total", outcome="failed") == 2
        assert one(after, "gridd_task_retries_total") == 1
        assert one(after, "gridd_tasks", status="review") == 2
        assert one(after, "gridd_tasks", status="failed") == 1
        assert one(after, "gridd_agents_limit") == 2
        assert one(after, "gridd_session_active") == 0  # stopped: no work left
        assert one(after, "gridd_session_budget_dollars") == 50.0
        assert one(after, "gridd_task_ready_to_started_seconds_count") == 4
        assert one(after, "gridd_task_result_to_review_seconds_count") == 2
        assert 0 < one(after, "gridd_task_result_to_review_seconds_sum") < 30
        assert one(after, "gridd_events_published_total") > one(
            before, "gridd_events_published_total"
        )
        assert one(after, "gridd_events_by_type_total", type="agent.spawned") == 4
        assert one(after, "gridd_event_log_events") >= one(after, "gridd_events_published_total")
        assert one(after, "gridd_database_size_bytes") > 0
        assert one(after, "gridd_background_part_up", part="scheduler") == 1
        # Requests are labelled by route template, never by the id in the path.
        assert (
            one(
                after,
                "gridd_http_requests_total",
                method="GET",
                route="/tasks/{task_id}",
                code="200",
            )
            >= 2
        )
        assert (
            one(after, "gridd_http_request_duration_seconds_count", method="GET", route="/metrics")
            >= 1
        )
        for name, series in after.items():
            for labels in series:
                values = {v for _, v in labels}
                assert not values & {"t1", "t2", "t3"}, (name, labels)


def test_unknown_paths_and_methods_do_not_make_new_series(repo: Path) -> None:
    with core_daemon(repo) as daemon:
        c = daemon.client()
        for n in range(5):
            response = c._http.request("GET", f"/no/such/{n}")
            assert response.status_code == 404
        response = c._http.request("BREW", "/health")
        samples = scrape(c)
        routes = {dict(k)["route"] for k in samples["gridd_http_requests_total"]}
        methods = {dict(k)["method"] for k in samples["gridd_http_requests_total"]}
        assert "unmatched" in routes
        assert not any(r.startswith("/no/such") for r in routes)
        assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}


def test_questions_pending_and_sse_clients_are_reported(repo: Path) -> None:
    write_core_config(
        repo,
        agents={"asker": {"command": agent_command("ask_heartbeat.py"), "adapter": "heartbeat"}},
        scheduler={"default_agent": "asker"},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/plans", {"tasks": [{"id": "q1", "title": "asks"}]})
        c.post("/session/start", {"featureBranch": "feature/q"})
        wait_for(lambda: c.get("/questions"), timeout=20, message="a pending question")
        stream = daemon.client().events()
        next(stream)  # the snapshot: the stream is subscribed
        samples = wait_for(
            lambda: (s := scrape(c)) and one(s, "gridd_questions_oldest_age_seconds") > 0 and s,
            message="the question to age",
        )
        assert one(samples, "gridd_questions_pending") == 1
        assert one(samples, "gridd_sse_clients") == 1
        assert one(samples, "gridd_questions_asked_total") == 1
        stream.close()  # type: ignore[attr-defined]


def test_each_daemon_has_its_own_registry_not_the_global_one(repo: Path) -> None:
    with core_daemon(repo) as daemon:
        assert "gridd_tasks" in daemon.client().get_text("/metrics")
    assert not any(m.name.startswith("gridd_") for m in prometheus_client.REGISTRY.collect())


def test_gridctl_metrics_prints_families_readably(repo: Path) -> None:
    with core_daemon(repo) as daemon:
        daemon.client().get("/tasks")
        result = gridctl(repo, "--no-start", "metrics")
        assert result.returncode == 0, result.stderr
        assert "gridd_agents_limit (gauge): The session's maxAgents" in result.stdout
        assert "gridd_agents_limit  3" in result.stdout
        assert 'route="/tasks"' in result.stdout
        assert "process_" not in result.stdout
        only = gridctl(repo, "--no-start", "metrics", "merge")
        assert "gridd_merge_queue_depth" in only.stdout
        assert "gridd_tasks" not in only.stdout
        raw = gridctl(repo, "--no-start", "metrics", "--raw")
        assert "# TYPE gridd_tasks gauge" in raw.stdout
        assert list(text_string_to_metric_families(raw.stdout))


def test_background_parts_come_from_the_supervisor_when_there_is_one() -> None:
    from types import SimpleNamespace
    from typing import Any

    from gridd.metrics.feed import supervised_parts

    background = SimpleNamespace(names=["scheduler", "agent:a1", "notifier"])
    plain: Any = SimpleNamespace(background=background)
    assert supervised_parts(plain) == {"scheduler": "up", "notifier": "up"}
    part = SimpleNamespace(state="restarting")
    supervised: Any = SimpleNamespace(
        background=background,
        supervisor=SimpleNamespace(states=lambda: {"scheduler": "up", "beads-poll": part}),
    )
    assert supervised_parts(supervised) == {"scheduler": "up", "beads-poll": "restarting"}


def test_merges_are_counted_from_the_merge_queues_events(repo: Path) -> None:
    write_core_config(
        repo,
        agents={"work": {"command": agent_command("trivial.py")}},
        scheduler={"default_agent": "work", "stop_when_idle": False},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/plans", {"tasks": [{"id": "mg1", "title": "merged"}]})
        c.post("/session/start", {"featureBranch": "feature/metrics", "maxAgents": 1})
        wait_task_status(c, "mg1", "review")
        c.post("/tasks/mg1/approve")
        wait_task_status(c, "mg1", "done")
        samples = wait_for(
            lambda: (s := scrape(c)) and one(s, "gridd_merges_total") == 1 and s,
            message="the merge to be counted",
        )
        assert one(samples, "gridd_merge_queue_depth") == 0
        assert one(samples, "gridd_tasks", status="done") == 1
        assert one(samples, "gridd_merge_conflicts_total") == 0
