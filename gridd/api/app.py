"""The Starlette application: routes, error handlers, and the ``Grid`` behind them."""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from gridd.api import resources as _resources  # noqa: F401  (registers its routes)
from gridd.api.durable import DurableAnswers
from gridd.api.errors import EXCEPTION_HANDLERS, SplitIdGuard, query_flag
from gridd.api.health import HealthBody
from gridd.api.metrics_http import RequestTimer
from gridd.api.spec import grid_of, table, wire
from gridd.api.sse import RAW_SEND, events_endpoint
from gridd.grid import Grid
from gridd.model import RepoState, VersionInfo


@table.add("GET", "/version", summary="Daemon and API version", response=VersionInfo)
async def version(request: Request) -> Response:
    return wire(grid_of(request).version())


@table.add("GET", "/state", summary="Full RepoState snapshot", response=RepoState)
async def state(request: Request) -> Response:
    return Response(grid_of(request).state_json(), media_type="application/json")


@table.add(
    "POST",
    "/shutdown",
    summary="Graceful daemon shutdown (?agents=1 stops the running agents first)",
    status=202,
    query={"agents": "1: stop every running agent first (as a session stop), then exit"},
)
async def shutdown(request: Request) -> Response:
    grid = grid_of(request)
    if query_flag(request, "agents"):
        stopping = grid.shutdown_stopping_agents()
        body = {
            "status": "shutting_down",
            "agentsStopping": stopping,
            "waitSeconds": grid.shutdown_wait_seconds() if stopping else 0,
        }
        return JSONResponse(body, status_code=202)
    # Answer first, then stop: the caller deserves to hear that we heard it.
    asyncio.get_running_loop().call_later(0.05, grid.request_shutdown)
    return JSONResponse({"status": "shutting_down"}, status_code=202)


@table.add(
    "GET",
    "/events",
    summary="Server-Sent Events: the durable event log, replayable by Last-Event-ID",
    query={"since": "replay events after this id", "types": "comma-separated event types"},
    content_type="text/event-stream",
)
async def events(request: Request) -> Response:
    return await events_endpoint(request)


@table.add("GET", "/openapi.json", summary="This API's OpenAPI document")
async def openapi(request: Request) -> Response:
    # Built on first request, not at startup: generating the JSON schemas of every model
    # took a third of a cold start, and most daemons are never asked.
    document: dict[str, object] | None = request.app.state.openapi
    if document is None:
        document = request.app.state.openapi = table.openapi()
    return JSONResponse(document)


class GriddApp(Starlette):
    """Starlette, keeping the server's own ``send`` in the scope (``RAW_SEND``) so that an
    event stream's body bypasses the middleware wrappers once its response has started."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[RAW_SEND] = send
        await super().__call__(scope, receive, send)


def create_app(grid: Grid) -> Starlette:
    app = GriddApp(
        # /health first: it is asked most often, and routes are matched in order.
        routes=table.routes(first=("/health",)),
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[
            Middleware(RequestTimer, stats=grid.metrics.requests),
            Middleware(DurableAnswers, store=grid.store),
            Middleware(SplitIdGuard, paths=[ep.path for ep in table.endpoints]),
        ],
    )
    # /tasks/ is an unknown path answered in the JSON error format, not a 307 to /tasks
    # with a body that is not JSON (and a client that may not follow it over the socket).
    app.router.redirect_slashes = False
    app.state.grid = grid
    app.state.health = HealthBody(grid)
    app.state.openapi = None
    return app
