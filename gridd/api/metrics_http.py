"""``GET /metrics`` and the request timer behind ``gridd_http_request_duration_seconds``.

The timer is a plain ASGI middleware. It labels a request by its route *template*
(``/tasks/{task_id}``, read from ``scope["route"]`` after Starlette routed it), never by the
raw path, so an id in a URL cannot make a new series; an unrouted path is ``unmatched``.
Event streams are counted but not timed: their duration is how long a client listened.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gridd.api.spec import grid_of, table
from gridd.metrics.feed import RequestStats

#: prometheus_client.CONTENT_TYPE_LATEST, without importing it before the first scrape.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Any other method token is labelled "other": a label set must stay bounded.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@table.add(
    "GET",
    "/metrics",
    summary="Prometheus metrics (text exposition format 0.0.4)",
    content_type="text/plain",
)
async def metrics(request: Request) -> Response:
    body = grid_of(request).metrics.render()
    return Response(body, media_type=CONTENT_TYPE)


class RequestTimer:
    """Counts and times every HTTP request by method, route template and status."""

    def __init__(self, app: ASGIApp, stats: RequestStats) -> None:
        self.app = app
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        streaming = False

        async def send_and_note(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for name, value in message.get("headers", ()):
                    if name == b"content-type" and value.startswith(b"text/event-stream"):
                        streaming = True
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = str(scope.get("method", ""))
            method = method if method in METHODS else "other"
            seconds = None if streaming else time.perf_counter() - started
            self.stats.record(method, route, status, seconds)
