"""A tiny route table that also yields ``/openapi.json`` from the pydantic models.

Each endpoint is declared once with its request and response models; Starlette routes and
the OpenAPI document are both derived from that declaration, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gridd import API_VERSION, __version__
from gridd.ids import TASK_ID_RE
from gridd.model import ErrorBody, WireModel

if TYPE_CHECKING:
    from gridd.grid import Grid

Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class Endpoint:
    method: str
    path: str
    handler: Handler
    summary: str
    body: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    response_list: bool = False
    query: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    status: int = 200  # the success status the handler answers with
    body_list: bool = False  # the body may also be a list of ``body``
    body_types: tuple[str, ...] = ("application/json",)
    #: Other statuses answered with the same response model: status -> description.
    also: dict[int, str] = field(default_factory=dict)


class RouteTable:
    def __init__(self) -> None:
        self.endpoints: list[Endpoint] = []

    def add(
        self,
        method: str,
        path: str,
        *,
        summary: str,
        body: type[BaseModel] | None = None,
        response: type[BaseModel] | None = None,
        response_list: bool = False,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        status: int = 200,
        body_list: bool = False,
        body_types: tuple[str, ...] = ("application/json",),
        also: dict[int, str] | None = None,
    ) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.endpoints.append(
                Endpoint(
                    method=method,
                    path=path,
                    handler=handler,
                    summary=summary,
                    body=body,
                    response=response,
                    response_list=response_list,
                    query=query or {},
                    content_type=content_type,
                    status=status,
                    body_list=body_list,
                    body_types=body_types,
                    also=also or {},
                )
            )
            return handler

        return register

    def routes(self, *, first: tuple[str, ...] = ()) -> list[Route]:
        """One route per path, in declaration order except for the paths in ``first``."""
        by_path: dict[str, dict[str, Handler]] = {path: {} for path in first}
        for ep in self.endpoints:
            by_path.setdefault(ep.path, {})[ep.method] = ep.handler
        return [_method_route(path, methods) for path, methods in by_path.items() if methods]

    def openapi(self) -> dict[str, Any]:
        models: dict[str, type[BaseModel]] = {"ErrorBody": ErrorBody}
        paths: dict[str, dict[str, Any]] = {}
        for ep in self.endpoints:
            op: dict[str, Any] = {"summary": ep.summary, "responses": {}}
            params = _path_params(ep.path)
            params += [
                {
                    "name": n,
                    "in": "query",
                    "required": False,
                    "description": d,
                    "schema": _param_schema(n),
                }
                for n, d in ep.query.items()
            ]
            if params:
                op["parameters"] = params
            if ep.body is not None:
                models[ep.body.__name__] = ep.body
                body_schema: dict[str, Any] = _ref(ep.body)
                if ep.body_list:
                    body_schema = {"oneOf": [body_schema, {"type": "array", "items": body_schema}]}
                op["requestBody"] = {
                    "required": True,
                    "content": {t: {"schema": body_schema} for t in ep.body_types},
                }
            ok: dict[str, Any] = {"description": "OK"}
            if ep.response is not None:
                models[ep.response.__name__] = ep.response
                schema: dict[str, Any] = _ref(ep.response)
                if ep.response_list and ep.body_list:
                    schema = {"oneOf": [schema, {"type": "array", "items": schema}]}
                elif ep.response_list:
                    schema = {"type": "array", "items": schema}
                ok["content"] = {ep.content_type: {"schema": schema}}
            elif ep.content_type != "application/json":
                ok["content"] = {ep.content_type: {"schema": {"type": "string"}}}
            op["responses"][str(ep.status)] = ok
            for status, description in ep.also.items():
                op["responses"][str(status)] = {**ok, "description": description}
            error = {"application/json": {"schema": _ref(ErrorBody)}}
            op["responses"]["4XX"] = {"description": "Client error", "content": error}
            if ep.body is not None:
                op["responses"]["413"] = {
                    "description": "Body over 32 MiB (the connection is closed)",
                    "content": error,
                }
            if ep.method != "GET":
                op["responses"]["503"] = {
                    "description": "The state database cannot be used right now",
                    "content": error,
                }
                op["responses"]["507"] = {
                    "description": "The disk is full or read-only: nothing was recorded",
                    "content": error,
                }
            paths.setdefault(_openapi_path(ep.path), {})[ep.method.lower()] = op
        schemas: dict[str, Any] = {}
        for name, model in models.items():
            model_schema = model.model_json_schema(
                by_alias=True, ref_template="#/components/schemas/{model}"
            )
            schemas.update(model_schema.pop("$defs", {}))
            schemas[name] = model_schema
        return {
            "openapi": "3.1.0",
            "info": {
                "title": "gridd",
                "version": __version__,
                "description": f"gridd API version {API_VERSION}, served on .grid/gridd.sock",
            },
            "paths": paths,
            "components": {"schemas": schemas},
        }


#: What a query or path parameter accepts, by name, as the handlers parse it (a string
#: otherwise). Kept next to the parsers' rules: ``query_int`` and the id checks.
PARAM_SCHEMAS: dict[str, dict[str, Any]] = {
    "limit": {"type": "integer", "minimum": 1},
    "since": {"type": "integer", "minimum": 0},
    "task_id": {"type": "string", "pattern": f"^{TASK_ID_RE.pattern}$"},
}


def _param_schema(name: str) -> dict[str, Any]:
    return dict(PARAM_SCHEMAS.get(name, {"type": "string"}))


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _openapi_path(path: str) -> str:
    return path.replace(":path}", "}")


def _path_params(path: str) -> list[dict[str, Any]]:
    params = []
    for part in path.split("/"):
        if part.startswith("{") and part.endswith("}"):
            name = part[1:-1].split(":")[0]
            params.append(
                {"name": name, "in": "path", "required": True, "schema": _param_schema(name)}
            )
    return params


def _method_route(path: str, methods: dict[str, Handler]) -> Route:
    allowed = list(methods)
    if allowed == ["GET"]:
        return Route(path, methods["GET"], methods=allowed)  # Starlette adds HEAD itself

    async def dispatch(request: Request) -> Response:
        return await methods[request.method](request)

    if "GET" in allowed and "HEAD" not in allowed:
        methods = {**methods, "HEAD": methods["GET"]}
        allowed.append("HEAD")
    return Route(path, dispatch, methods=allowed)


#: The one route table every API module registers into.
table = RouteTable()


def wire(model: WireModel | list[WireModel], status: int = 200) -> Response:
    if isinstance(model, list):
        return JSONResponse([m.wire() for m in model], status_code=status)
    # Serialised in one pass by pydantic-core (a dict and then json.dumps costs twice that:
    # a third of a /health request).
    body = model.model_dump_json(by_alias=True)
    return Response(body, status_code=status, media_type="application/json")


def grid_of(request: Request) -> Grid:
    grid: Grid = request.app.state.grid
    return grid
