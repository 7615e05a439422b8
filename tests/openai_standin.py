"""A loopback stand-in for the OpenAI Responses API, scripted per test, for running the
real Codex CLI offline (a ``model_providers`` entry of ``$CODEX_HOME/config.toml`` whose
``base_url`` is ``standin.url + "/v1"`` and ``wire_api = "responses"``; codex ignores
``OPENAI_BASE_URL``).

It serves ``POST /v1/responses`` as SSE (``response.created``, one
``response.output_item.done`` per item, ``response.completed`` with the usage) on
127.0.0.1 (``tests/standin.py`` has what the stand-ins share: the script, the records, the
server). Each request takes the next scripted ``Turn``: text, a function call, or an HTTP
error with headers and body. When the script is empty, the turn is a plain "Done." Every
request body is recorded (``requests``).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.standin import Reply, ScriptedAPI, not_here

MODEL = "gpt-5-codex"


@dataclass
class Turn(Reply):
    """One scripted answer: ``text`` and/or ``calls`` ((function name, arguments) pairs), or
    an HTTP error (``status`` >= 400 with ``headers`` and ``body``)."""

    text: str | None = None
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    body: dict[str, Any] = field(default_factory=dict)
    #: A usage limit (429 ``usage_limit_reached``) that resets at this epoch second.
    resets_at: int | None = None
    input_tokens: int = 1200
    output_tokens: int = 80


def text(body: str, **kw: Any) -> Turn:
    return Turn(text=body, **kw)


def call(name: str, arguments: dict[str, Any], **kw: Any) -> Turn:
    return Turn(calls=[(name, arguments)], **kw)


def error(status: int, *, message: str = "", kind: str = "", code: str | None = None) -> Turn:
    kinds = {400: "invalid_request_error", 429: "rate_limit_exceeded", 500: "server_error"}
    payload = {
        "message": message or f"stand-in error {status}",
        "type": kind or kinds.get(status, "server_error"),
        "param": None,
        "code": code,
    }
    return Turn(status=status, body={"error": payload})


def usage_limit(*, resets_at: int) -> Turn:
    """A plan's usage limit (429 ``usage_limit_reached``) that resets at ``resets_at``."""
    turn = error(429, kind="usage_limit_reached", message="The usage limit has been reached")
    turn.resets_at = resets_at
    return turn


class StandIn(ScriptedAPI[Turn]):
    """Every request is a turn."""

    name = "openai-standin"

    @property
    def resets(self) -> list[int]:
        """The reset epochs of the usage limits served."""
        return [t.resets_at for t in self.answered if t.resets_at is not None]

    def inputs(self, kind: str) -> list[dict[str, Any]]:
        """Every input item of type ``kind`` the model was shown, without repeats."""
        seen: dict[str, dict[str, Any]] = {}
        for request in list(self.requests):
            for item in request.get("input", []):
                if isinstance(item, dict) and item.get("type") == kind:
                    seen.setdefault(json.dumps(item, sort_keys=True), item)
        return list(seen.values())

    def user_texts(self) -> list[str]:
        """The text of every user message the model was shown, without repeats."""
        out: list[str] = []
        for item in self.inputs("message"):
            if item.get("role") != "user":
                continue
            for part in item.get("content", []):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    out.append(part["text"])
        return out

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        turn = self.take(body) or Turn(text="Done.")
        await self.held(turn)
        if turn.resets_at is not None:
            turn.body["error"]["resets_at"] = turn.resets_at
            turn.body["error"]["resets_in_seconds"] = max(turn.resets_at - int(time.time()), 0)
        if turn.status >= 400:
            return web.json_response(turn.body, status=turn.status, headers=turn.headers)
        response = web.StreamResponse(
            headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
        )
        await response.prepare(request)
        response_id = f"resp_{uuid.uuid4().hex[:24]}"

        async def send(data: dict[str, Any]) -> None:
            await response.write(f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode())

        await send({"type": "response.created", "response": {"id": response_id}})
        items: list[dict[str, Any]] = []
        if turn.text:
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "id": f"msg_{uuid.uuid4().hex[:24]}",
                    "content": [{"type": "output_text", "text": turn.text}],
                }
            )
        for name, arguments in turn.calls:
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{uuid.uuid4().hex[:24]}",
                    "call_id": f"call_{uuid.uuid4().hex[:24]}",
                    "name": name,
                    "arguments": json.dumps(arguments),
                }
            )
        for item in items:
            await send({"type": "response.output_item.done", "item": item})
        usage = {
            "input_tokens": turn.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": turn.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": turn.input_tokens + turn.output_tokens,
        }
        await send({"type": "response.completed", "response": {"id": response_id, "usage": usage}})
        await response.write_eof()
        return response

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [], "models": []})

    async def _other(self, request: web.Request) -> web.Response:
        return await not_here(request, {"error": {"message": "not here"}})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._other)
        return app


#: ``with standin(*turns) as api``: a stand-in scripted with ``turns``, running.
standin = StandIn.serving
