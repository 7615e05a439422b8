"""``GET /health`` is served from bytes cached by what it reports, and is never stale.

Each test changes one thing the report shows and asks at once: the answer must show it on
the very next request, exactly as ``Grid.health()`` reports it, with a fresh uptime.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import httpx

from gridd.errors import StoreError
from gridd.grid import Grid
from tests.support.daemons import inprocess_daemon


def _http(sock: Path) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(sock)), base_url="http://gridd", timeout=10
    )


def _expected(grid: Grid, served: dict[str, Any]) -> dict[str, Any]:
    """What the uncached report says now, with the uptime the response carried."""
    report = json.loads(grid.health().model_dump_json(by_alias=True))
    report["uptime"] = served["uptime"]
    return report


async def test_health_shows_each_change_on_the_next_request(repo: Path) -> None:
    async with inprocess_daemon(repo) as d, _http(d.sock) as http:
        grid = cast(Grid, d.grid)
        first = (await http.get("/health")).json()
        assert first["status"] == "ok" and first == _expected(grid, first)

        grid.warnings.append("state database was unreadable; moved aside")
        warned = await http.get("/health")
        assert warned.status_code == 200
        assert warned.json()["warnings"] == ["state database was unreadable; moved aside"]
        assert warned.json()["status"] == "degraded"
        assert warned.json() == _expected(grid, warned.json())

        grid.pool.monitor.paused["a-1"] = "output file unreadable"
        paused = (await http.get("/health")).json()
        assert (
            paused["warnings"][-1]
            == "agent a-1: watching paused (output file unreadable); retrying"
        )
        del grid.pool.monitor.paused["a-1"]
        assert len((await http.get("/health")).json()["warnings"]) == 1

        grid.store.write_error = StoreError("the disk is full", code="disk_full")
        down = await http.get("/health")
        assert down.status_code == 503
        assert down.json()["coreDown"] is True and "store" in down.json()["degraded"]
        assert down.json() == _expected(grid, down.json())
        grid.store.write_error = None
        assert (await http.get("/health")).status_code == 200


async def test_health_uptime_is_written_per_request(repo: Path) -> None:
    async with inprocess_daemon(repo) as d, _http(d.sock) as http:
        grid = cast(Grid, d.grid)
        before = (await http.get("/health")).json()["uptime"]
        floor = grid.uptime + 0.002
        while grid.uptime < floor:  # the clock, not a sleep: the next reading is later
            await http.get("/version")
        after = await http.get("/health")
        assert after.json()["uptime"] > before
        assert int(after.headers["content-length"]) == len(after.content)
        head = await http.head("/health")
        assert head.status_code == 200 and head.content == b""
