"""A loopback stand-in for the Anthropic Messages API, scripted per test, for running the
real Claude Code CLI offline (``ANTHROPIC_BASE_URL=standin.url``).

It serves ``POST /v1/messages`` (SSE when ``stream`` is true, JSON otherwise),
``POST /v1/messages/count_tokens`` and ``GET /v1/models`` on 127.0.0.1 (``tests/standin.py``
has what the stand-ins share: the script, the records, the server).

Each request that offers tools is a turn of the conversation: it takes the next scripted
``Turn`` (text, tool_use, or an HTTP error with headers). When the script is empty, the
turn is a plain "Done." ending the conversation. Requests without tools are the CLI's side
calls (titles, summaries): they get a short text and leave the script alone. Every request
is recorded (``requests``) so tests can assert what the model saw.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.standin import Reply, ScriptedAPI, not_here

MODEL = "claude-sonnet-4-5-20250929"


@dataclass
class Turn(Reply):
    """One scripted answer: ``text`` and/or ``tool_uses`` ((name, input) pairs), or an HTTP
    error (``status`` >= 400 with ``headers`` and an Anthropic error body)."""

    text: str | None = None
    tool_uses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    error_type: str = "api_error"
    error_message: str = "error"
    #: A subscription limit (``five_hour``, ...) that resets this many seconds after its
    #: first request (``reset_at``, also in ``resets``): every turn until that second gets
    #: the same 429 with its unified headers, as a CLI retrying by itself would see.
    limit_claim: str | None = None
    reset_in: float = 5.0
    reset_at: int | None = None
    input_tokens: int = 25
    output_tokens: int = 12

    def holds(self) -> bool:
        return self.persists or self.limit_claim is not None

    def over(self) -> bool:
        return self.reset_at is not None and time.time() >= self.reset_at

    def taken(self) -> None:
        if self.limit_claim is not None and self.reset_at is None:
            self.reset_at = int(time.time() + self.reset_in) + 1
            self.headers = {
                **unified_limit_headers(claim=self.limit_claim, reset=self.reset_at),
                **self.headers,
            }


def text(body: str, **kw: Any) -> Turn:
    return Turn(text=body, **kw)


def tool(name: str, tool_input: dict[str, Any], *, say: str | None = None, **kw: Any) -> Turn:
    return Turn(text=say, tool_uses=[(name, tool_input)], **kw)


def error(
    status: int,
    *,
    headers: dict[str, str] | None = None,
    kind: str = "",
    message: str = "",
    persists: bool = False,
) -> Turn:
    kinds = {429: "rate_limit_error", 529: "overloaded_error", 500: "api_error"}
    return Turn(
        status=status,
        headers=dict(headers or {}),
        error_type=kind or kinds.get(status, "api_error"),
        error_message=message or f"stand-in error {status}",
        persists=persists,
    )


def limit(claim: str, *, reset_in: float = 5.0, headers: dict[str, str] | None = None) -> Turn:
    """A subscription's usage limit (429, rejected by the unified limiter), resetting
    ``reset_in`` seconds after its first request; ``headers`` are added to its own."""
    turn = error(429, message="usage limit reached", headers=headers)
    turn.limit_claim, turn.reset_in = claim, reset_in
    return turn


def unified_limit_headers(
    *, claim: str, reset: float, retry_after: float | None = None
) -> dict[str, str]:
    """The headers of a subscription's rejected request (the "unified" rate limiter):
    ``claim`` is five_hour, seven_day, seven_day_opus, seven_day_sonnet."""
    headers = {
        "anthropic-ratelimit-unified-status": "rejected",
        "anthropic-ratelimit-unified-reset": str(int(reset)),
        "anthropic-ratelimit-unified-representative-claim": claim,
        f"anthropic-ratelimit-unified-{claim.replace('_', '-')}-status": "rejected",
        f"anthropic-ratelimit-unified-{claim.replace('_', '-')}-reset": str(int(reset)),
        "anthropic-ratelimit-unified-fallback-percentage": "0.5",
        "anthropic-ratelimit-unified-overage-status": "rejected",
        "anthropic-ratelimit-unified-overage-disabled-reason": "org_level_disabled",
    }
    if retry_after is not None:
        headers["retry-after"] = str(int(retry_after))
    return headers


class StandIn(ScriptedAPI[Turn]):
    name = "anthropic-standin"

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[dict[str, str]] = []

    @property
    def resets(self) -> list[int]:
        """The reset epochs of the limits served."""
        return [t.reset_at for t in self.answered if t.reset_at is not None]

    def tool_results(self) -> list[dict[str, Any]]:
        """Every tool_result block the model was shown, in order, without repeats."""
        seen: dict[str, dict[str, Any]] = {}
        for request in self.turns():
            for message in request.get("messages", []):
                content = message.get("content")
                for block in content if isinstance(content, list) else []:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        seen.setdefault(str(block.get("tool_use_id")), block)
        return list(seen.values())

    def user_texts(self, request: dict[str, Any] | None = None) -> list[str]:
        """The text of every user message in ``request``'s conversation (a turn's body;
        the last turn's by default)."""
        turns = [request] if request is not None else self.turns()[-1:]
        out: list[str] = []
        for message in turns[-1].get("messages", []) if turns else []:
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, str):
                out.append(content)
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "text":
                    out.append(str(block.get("text")))
        return out

    # -- serving -------------------------------------------------------------------------

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.headers.append(dict(request.headers))
        # Requests without tools are the CLI's side calls (titles, summaries).
        turn = self.take(body, turn=bool(body.get("tools")))
        if turn is None:
            turn = Turn(text="Done." if body.get("tools") else "A short title")
        await self.held(turn)
        if turn.status >= 400:
            payload = {
                "type": "error",
                "error": {"type": turn.error_type, "message": turn.error_message},
            }
            return web.json_response(payload, status=turn.status, headers=turn.headers)
        model = str(body.get("model") or MODEL)
        blocks: list[dict[str, Any]] = []
        if turn.text:
            blocks.append({"type": "text", "text": turn.text})
        for name, tool_input in turn.tool_uses:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{uuid.uuid4().hex[:24]}",
                    "name": name,
                    "input": tool_input,
                }
            )
        stop = "tool_use" if turn.tool_uses else "end_turn"
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        usage = {
            "input_tokens": turn.input_tokens,
            "output_tokens": turn.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": blocks,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                },
                headers=turn.headers,
            )
        response = web.StreamResponse(
            headers={
                "content-type": "text/event-stream",
                "cache-control": "no-cache",
                **turn.headers,
            }
        )
        await response.prepare(request)

        async def send(event: str, data: dict[str, Any]) -> None:
            await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())

        await send(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
        )
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                await send(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
                await send(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": block["text"]},
                    },
                )
            else:
                start = {**block, "input": {}}
                await send(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": start},
                )
                raw = json.dumps(block["input"])
                for piece in (raw[: len(raw) // 2], raw[len(raw) // 2 :]):
                    await send(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": piece},
                        },
                    )
            await send("content_block_stop", {"type": "content_block_stop", "index": index})
        await send(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": turn.output_tokens},
            },
        )
        await send("message_stop", {"type": "message_stop"})
        await response.write_eof()
        return response

    async def _count_tokens(self, request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"input_tokens": 42})

    async def _models(self, request: web.Request) -> web.Response:
        entry = {
            "type": "model",
            "id": MODEL,
            "display_name": "Stand-in",
            "created_at": "2025-09-29T00:00:00Z",
        }
        return web.json_response(
            {"data": [entry], "has_more": False, "first_id": MODEL, "last_id": MODEL}
        )

    async def _other(self, request: web.Request) -> web.Response:
        return await not_here(
            request, {"type": "error", "error": {"type": "not_found_error", "message": "not here"}}
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._other)
        return app


#: ``with standin(*turns) as api``: a stand-in scripted with ``turns``, running.
standin = StandIn.serving
