"""Every failure a client can cause becomes ``{"error": {"code", "message", "details"}}``.

Request bodies and query parameters are parsed here, so malformed input is a 400 and
invalid values a 422 naming the field, never a 500. An id a client percent-encoded a '/'
into is refused here too (``SplitIdGuard``), before the decoded path is routed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gridd.api.body import read_document
from gridd.errors import (
    DISK_CODES,
    BadRequest,
    GriddError,
    NotFound,
    StoreError,
    ValidationFailed,
)
from gridd.ids import task_id_problem

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_failed",
}


def error_response(status: int, code: str, message: str, details: Any = None) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return JSONResponse(body, status_code=status)


async def handle_gridd_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GriddError)
    status = exc.status
    if isinstance(exc, StoreError):
        status = 507 if exc.code in DISK_CODES else 503
        log.error("store error on %s %s: %s", request.method, request.url.path, exc.message)
    response = error_response(status, exc.code, exc.message, exc.details)
    if status == 413:
        # The rest of the body is never read: end the connection rather than drain it.
        response.headers["connection"] = "close"
    return response


async def handle_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    if exc.status_code == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
        if len(request.url.path) > 1 and request.url.path.endswith("/"):
            message += f" (gridd's paths have no trailing '/': {request.url.path.rstrip('/')})"
    elif exc.status_code == 405:
        message = f"method {request.method} not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    response = error_response(exc.status_code, code, message, {"path": request.url.path})
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def handle_client_disconnect(request: Request, exc: Exception) -> Response:
    """The client went away before its request was read: nothing failed on our side, and
    no one is left to answer (the status only reaches the request metrics)."""
    log.debug("client disconnected during %s %s", request.method, request.url.path)
    return error_response(400, "client_disconnected", "the client disconnected mid-request")


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(
        500,
        "internal_error",
        "gridd hit an unexpected error; details are in .grid/gridd.log",
        {"type": type(exc).__name__},
    )


EXCEPTION_HANDLERS = {
    GriddError: handle_gridd_error,
    HTTPException: handle_http_error,
    ClientDisconnect: handle_client_disconnect,
    Exception: handle_unexpected,
}


# -- ids split by an encoded '/' --------------------------------------------------------------


#: A route's path parameter that holds an id, and the kind of id it holds.
ID_PARAMS = {"{task_id}": "task", "{agent_id}": "agent", "{question_id}": "question"}


@dataclass(frozen=True)
class IdRoute:
    """An id-bearing route template, as segments: ``("", "tasks", None, "start")``, the id
    (of ``kind``) at ``None``."""

    segments: tuple[str | None, ...]
    kind: str

    @classmethod
    def of(cls, path: str) -> IdRoute | None:
        parts = path.split("/")
        kinds = [ID_PARAMS[p] for p in parts if p in ID_PARAMS]
        if len(kinds) != 1:
            return None
        return cls(tuple(None if p in ID_PARAMS else p for p in parts), kinds[0])


def split_id(raw_path: bytes, routes: Iterable[IdRoute]) -> tuple[str, str] | None:
    """``(kind, id)`` when the path as sent names an id-bearing route whose id holds a
    percent-encoded '/', else None.

    The HTTP server decodes ``%2F`` before routing, so ``/tasks/a%2Fb`` would be routed as
    ``/tasks/a/b`` ("no such endpoint") and ``POST /tasks/a%2Fstart`` as starting task
    ``a``. No id holds a '/', so the request is about an id gridd cannot have. The method is
    not looked at: the id is wrong whatever was asked of it. A path that fits no route
    (``/tasks/a%2Fb/nosuch``) is left to be the unknown endpoint it is.
    """
    if b"%2f" not in raw_path.lower():
        return None
    parts = [unquote(p.decode("latin-1")) for p in raw_path.split(b"?", 1)[0].split(b"/")]
    for route in routes:
        if len(parts) != len(route.segments):
            continue
        ident = None
        for part, literal in zip(parts, route.segments, strict=True):
            if literal is None:
                ident = part
            elif part != literal:
                break
        else:
            if ident is not None and "/" in ident:
                return route.kind, ident
    return None


def id_error(kind: str, value: str) -> GriddError:
    """The error the API answers for an id it cannot have, in the words of the lookups."""
    shown = value[:80]
    if kind == "task":
        problem = task_id_problem(value) or "must not contain '/'"
        return ValidationFailed(
            f"invalid task id {shown!r}: {problem}",
            code="invalid_task_id",
            details={"id": shown, "problem": problem},
        )
    return NotFound(f"no {kind} {shown!r}", code=f"{kind}_not_found", details={"id": shown})


class SplitIdGuard:
    """ASGI middleware: refuses a request whose id segment holds an encoded '/'
    (``split_id``) with the error its lookup would give, before it is routed."""

    def __init__(self, app: ASGIApp, paths: Iterable[str]) -> None:
        self.app = app
        self.routes = [r for r in map(IdRoute.of, paths) if r is not None]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = split_id(scope.get("raw_path") or b"", self.routes)
            if found is not None:
                exc = id_error(*found)
                response = error_response(exc.status, exc.code, exc.message, exc.details)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def raw_error_response(
    status: int, reason: str, code: str, message: str, details: Any = None
) -> bytes:
    """A complete HTTP/1.1 error response with the JSON error body, closing the connection.

    For the places below the ASGI app (the HTTP protocol itself) that must answer alone.
    """
    body = json.dumps(
        {"error": {"code": code, "message": message, "details": details or {}}},
        separators=(",", ":"),
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    return head + body


async def read_json(request: Request) -> Any:
    """The request body as JSON (streamed, limited; see ``body``); an empty body is ``None``."""
    return await read_document(request)


def validation_details(exc: ValidationError, within: str = "") -> list[dict[str, Any]]:
    """Each problem and the field it is in; ``within``: the field the body was wrapped in,
    left out of the names (they then name places in the body as it was sent)."""
    problems = []
    for err in exc.errors():
        loc = err["loc"][1:] if within and err["loc"][:1] == (within,) else err["loc"]
        problems.append({"field": ".".join(str(p) for p in loc) or "(body)", "problem": err["msg"]})
    return problems


def validate(model: type[M], data: Any, *, within: str = "") -> M:
    """Validate ``data`` against ``model``; a 422 naming each bad field otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = validation_details(exc, within)
        first = problems[0]
        raise ValidationFailed(
            f"invalid request: {first['field']}: {first['problem']}",
            details={"problems": problems},
        ) from None


async def read_body(request: Request, model: type[M]) -> M:
    data = await read_json(request)
    return validate(model, {} if data is None else data)


def query_int(request: Request, name: str, *, minimum: int = 0) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(
            f"query parameter '{name}' must be an integer, got {raw!r}",
            code="bad_query",
            details={"parameter": name},
        ) from None
    if value < minimum:
        raise ValidationFailed(
            f"query parameter '{name}' must be >= {minimum}", details={"parameter": name}
        )
    return value


def query_flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "").lower()
    return raw in {"1", "true", "yes", "on"}
