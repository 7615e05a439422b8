"""``GET /health``: the daemon's liveness report, serialised once per change.

A monitor or an editor may ask many times a second, and the answer rarely changes: the
report (``Grid.health``) is serialised again only when something it shows has changed
(``Grid.health_key``: the supervisor's revision, the warnings, the paused watches, the
store's write error). Only the uptime is written per request, into the cached bytes.
Nothing is stale: the key is read at every request, exactly as the report was.
"""

from __future__ import annotations

from collections.abc import Hashable

from starlette.requests import Request
from starlette.responses import Response

from gridd.api.spec import table
from gridd.grid import Grid
from gridd.model import Health

#: The uptime the report is serialised with, then replaced per request.
_UPTIME_MARK = -1.0
_UPTIME_FIELD = b'"uptime":'


class HealthBody:
    """The JSON body and status of ``/health``, cached by ``Grid.health_key``."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self._key: Hashable = None
        self._head = self._tail = b""
        self._status = 200

    def render(self) -> tuple[bytes, int]:
        grid = self.grid
        key = grid.health_key()
        if key != self._key or not self._head:
            self._serialise(grid.health())
            self._key = key
        return self._head + repr(grid.uptime).encode() + self._tail, self._status

    def _serialise(self, report: Health) -> None:
        report.uptime = _UPTIME_MARK
        head, _, tail = (
            report.model_dump_json(by_alias=True)
            .encode()
            .partition(_UPTIME_FIELD + repr(_UPTIME_MARK).encode())
        )
        self._head, self._tail = head + _UPTIME_FIELD, tail
        self._status = 503 if report.core_down else 200


@table.add(
    "GET",
    "/health",
    summary="Liveness check: ok or degraded (503 when a core part is down)",
    response=Health,
    also={503: "degraded: a core part (the scheduler, the store) is not working"},
)
async def health(request: Request) -> Response:
    body: HealthBody = request.app.state.health
    content, status = body.render()
    return Response(content, status_code=status, media_type="application/json")
