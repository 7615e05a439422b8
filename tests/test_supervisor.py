"""The supervisor: a crashed background part is restarted with backoff, announced with
``daemon.degraded`` / ``daemon.recovered``, and shown on ``/health`` (503 for a core part,
200 "degraded" for another) and on ``/metrics``. In-process daemon, real socket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gridd.grid import Grid
from gridd.settings import SupervisorSettings
from gridd.specs import TaskSpec
from gridd.supervisor import PartState, after_crash
from tests.support.daemons import inprocess_daemon
from tests.support.repos import FAST_SCHEDULER
from tests.support.waits import until

SUPERVISION = {
    "backoff_seconds": 0.05,
    "backoff_max_seconds": 0.2,
    "flap_max": 3,
    "flap_window_seconds": 30,
    "down_retry_seconds": 1.5,
}


def _http(sock: Path) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(sock)), base_url="http://gridd", timeout=10
    )


async def _health_until(http: httpx.AsyncClient, want: Callable[[httpx.Response], bool]) -> Any:
    deadline = time.monotonic() + 20
    while True:
        response = await http.get("/health")
        if want(response):
            return response
        assert time.monotonic() < deadline, f"/health never matched: {response.text}"
        await asyncio.sleep(0.02)


def _events(grid: Grid, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in grid.store.events_after(0, types=[kind], limit=10_000)]


def _part_states(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gridd_background_part_state":
                out[(sample.labels["part"], sample.labels["state"])] = sample.value
    return out


async def test_a_crashing_scheduler_is_restarted_and_health_is_503_until_it_recovers(
    repo: Path,
) -> None:
    config = {"scheduler": FAST_SCHEDULER, "supervisor": SUPERVISION}
    async with inprocess_daemon(repo, config) as d, _http(d.sock) as http:
        grid = cast(Grid, d.grid)
        assert grid.supervisor.states()["scheduler"] == "up"
        real_pass = grid.scheduler.run_pass
        broken = True
        passes = 0

        def run_pass() -> Any:
            nonlocal passes
            passes += 1
            if broken:
                raise RuntimeError("injected scheduler bug")
            return real_pass()

        grid.scheduler.run_pass = run_pass  # type: ignore[method-assign]
        grid.scheduler.wake()
        # It crashes, is restarted (restarting), and after flap_max crashes is down.
        response = await _health_until(http, lambda r: r.status_code == 503)
        body = response.json()
        assert body["status"] == "degraded"
        assert "scheduler" in body["degraded"]
        assert body["parts"]["scheduler"] in ("restarting", "down")
        await until(lambda: grid.supervisor.states()["scheduler"] == "down", timeout=20)
        metrics = await http.get("/metrics")
        states = _part_states(metrics.text)
        assert states[("scheduler", "down")] == 1
        assert states[("scheduler", "up")] == 0
        assert states[("merge-queue", "up")] == 1
        degraded = _events(grid, "daemon.degraded")
        assert [e["part"] for e in degraded][:3] == ["scheduler"] * 3
        assert degraded[0]["state"] == "restarting" and degraded[0]["core"] is True
        assert degraded[2]["state"] == "down"
        assert "injected scheduler bug" in degraded[0]["error"]
        assert passes >= 3

        broken = False  # the bug is gone: the next try (after down_retry_seconds) stays up
        await _health_until(http, lambda r: r.status_code == 200 and r.json()["status"] == "ok")
        await until(lambda: real_pass_ran(grid), timeout=20)
        recovered = _events(grid, "daemon.recovered")
        assert recovered and recovered[-1]["part"] == "scheduler"
        # Scheduling works again: a task created now is picked up.
        task = grid.commands.create_tasks([TaskSpec(title="after recovery")])[0]
        assert task.id in grid.state.tasks
        metrics = await http.get("/metrics")
        assert _part_states(metrics.text)[("scheduler", "up")] == 1


def real_pass_ran(grid: Grid) -> bool:
    return grid.supervisor.states()["scheduler"] == "up"


async def test_a_crashing_non_core_part_is_degraded_with_200_and_comes_back(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gridd.git import merge

    real_order = merge.queue_order
    broken = True

    def queue_order(tasks: Any) -> Any:
        if broken:
            raise RuntimeError("injected merge queue bug")
        return real_order(tasks)

    monkeypatch.setattr(merge, "queue_order", queue_order)
    config = {"scheduler": FAST_SCHEDULER, "supervisor": {**SUPERVISION, "flap_max": 1000}}
    async with inprocess_daemon(repo, config) as d, _http(d.sock) as http:
        grid = cast(Grid, d.grid)
        response = await _health_until(
            http, lambda r: "merge-queue" in r.json().get("degraded", [])
        )
        assert response.status_code == 200
        assert response.json()["status"] == "degraded"
        assert response.json()["parts"]["scheduler"] == "up"
        await until(lambda: len(_events(grid, "daemon.degraded")) >= 2, timeout=20)
        first, second = _events(grid, "daemon.degraded")[:2]
        assert first["part"] == second["part"] == "merge-queue"
        assert first["core"] is False
        # Backoff doubles per recent crash.
        assert second["retryInSeconds"] > first["retryInSeconds"]
        broken = False
        await _health_until(http, lambda r: r.status_code == 200 and r.json()["status"] == "ok")
        assert _events(grid, "daemon.recovered")[-1]["part"] == "merge-queue"


def test_backoff_doubles_per_recent_crash_and_flapping_marks_a_part_down() -> None:
    s = SupervisorSettings(
        backoff_seconds=1, backoff_max_seconds=5, flap_max=4, flap_window_seconds=60
    )
    assert after_crash([100.0], 100.0, s).delay == 1
    assert after_crash([99.0, 100.0], 100.0, s).delay == 2
    assert after_crash([98.0, 99.0, 100.0], 100.0, s).delay == 4
    verdict = after_crash([97.0, 98.0, 99.0, 100.0], 100.0, s)
    assert verdict.state is PartState.DOWN and verdict.delay == s.down_retry_seconds
    # Old crashes fall out of the window: a part that ran well for a while starts afresh.
    late = after_crash([1.0, 2.0, 3.0, 100.0], 100.0, s)
    assert late.state is PartState.RESTARTING and late.delay == 1


async def test_a_claim_that_fails_badly_leaves_the_task_ready_not_working(repo: Path) -> None:
    """The claim fails and, cleaning up after it, something raises what no one expected:
    the attempt still fails cleanly (``task.start_failed``, back to ``ready`` with a
    backoff), the task is never left ``working`` with nothing running."""
    from gridd.errors import GriddError
    from gridd.model import Task, TaskStatus

    config = {"scheduler": {**FAST_SCHEDULER, "step_mode": True, "backoff_seconds": 30}}
    async with inprocess_daemon(repo, config) as d:
        grid = cast(Grid, d.grid)
        task = grid.commands.create_tasks([TaskSpec(title="claimed elsewhere")])[0]
        claims = 0

        async def claim(_: Task) -> bool:
            nonlocal claims
            claims += 1
            raise GriddError("bd could not answer", code="bd_error")

        async def discard(*_: Any, **__: Any) -> None:
            raise RuntimeError("injected: cleaning up the worktree failed")

        grid.pool.claimers[task.source] = claim
        grid.worktrees.discard = discard  # type: ignore[method-assign]
        grid.commands.start_task(task.id)
        await grid.scheduler.step()
        assert claims == 1
        after = grid.state.tasks[task.id]
        assert after.status == TaskStatus.READY, after
        assert task.id not in grid.pool.starting
        failed = _events(grid, "task.start_failed")
        assert failed and failed[-1]["taskId"] == task.id
        assert "RuntimeError" in str(failed[-1]["error"])
        await grid.scheduler.step()  # backing off: no second claim at once
        assert claims == 1
        assert grid.state.tasks[task.id].status == TaskStatus.READY


async def test_a_down_part_is_retried_at_once_when_the_store_takes_writes_again(
    repo: Path,
) -> None:
    """A scheduler whose passes failed on a full disk is down for ``down_retry_seconds``;
    once the store watch sees writes work again, it does not wait that out."""
    from gridd.errors import StoreError

    supervision = {**SUPERVISION, "down_retry_seconds": 300}
    async with inprocess_daemon(
        repo, {"scheduler": FAST_SCHEDULER, "supervisor": supervision}
    ) as d:
        grid = cast(Grid, d.grid)
        real_pass = grid.scheduler.run_pass
        full = True

        def run_pass() -> Any:
            if full:
                error = StoreError("the disk holding the state database is full", code="disk_full")
                grid.store.write_error = error
                raise error
            return real_pass()

        grid.scheduler.run_pass = run_pass  # type: ignore[method-assign]
        grid.scheduler.wake()
        await until(lambda: grid.supervisor.states()["scheduler"] == "down", timeout=20)
        full = False
        grid.store.write_error = StoreError("full", code="disk_full")  # as the disk left it
        # The store watch (every second) probes, finds the disk writable, retries the parts.
        await until(lambda: grid.supervisor.states()["scheduler"] == "up", timeout=10)
        assert grid.store.write_error is None
        assert grid.health().status == "ok"
