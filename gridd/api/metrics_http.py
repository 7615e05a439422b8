"""``GET /metrics`` and the request timer behind ``gridd_http_request_duration_seconds``.

The timer is a plain ASGI middleware. It labels a request by its route *template*
(``/tasks/{task_id}``, read from ``scope["route"]`` after Starlette routed it), never by the
raw path, so an id in a URL cannot make a new series; an unrouted path is ``unmatched``.
Event streams are counted but not timed: their duration is how long a client listened.
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gridd.api.spec import grid_of, table

#: Any other method token is labelled "other": a label set must stay bounded.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


@table.add(
    "GET",
    "/metrics",
    summary="Prometheus metrics (text exposition format 0.0.4)",
    content_type="text/plain",
)
async def metrics(request: Request) -> Response:
    body = grid_of(request).metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)


class RequestTimer:
    """Counts and times every HTTP request by method, route template and status."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
        self.latency = Histogram(
            "gridd_http_request_duration_seconds",
            "API request latency by route template (event streams excluded)",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.requests = Counter(
            "gridd_http_requests",
            "API requests by route template and status code",
            ["method", "route", "code"],
            registry=registry,
        )
        # labels() takes a lock and builds a key each time; a route's child is made once.
        self._timers: dict[tuple[str, str], Histogram] = {}
        self._counts: dict[tuple[str, str, int], Counter] = {}

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
            self._record(scope, status, streaming, time.perf_counter() - started)

    def _record(self, scope: Scope, status: int, streaming: bool, seconds: float) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        method = str(scope.get("method", ""))
        method = method if method in METHODS else "other"
        key = (method, route)
        if not streaming:
            timer = self._timers.get(key)
            if timer is None:
                timer = self._timers[key] = self.latency.labels(method, route)
            timer.observe(seconds)
        count_key = (method, route, status)
        counter = self._counts.get(count_key)
        if counter is None:
            counter = self._counts[count_key] = self.requests.labels(method, route, str(status))
        counter.inc()
