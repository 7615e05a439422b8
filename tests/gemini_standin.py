"""A loopback stand-in for the Gemini API, scripted per test, for running the real Gemini
CLI offline (``GOOGLE_GEMINI_BASE_URL=standin.url``, ``GEMINI_API_KEY`` any string).

It serves ``POST /v1beta/models/<model>:streamGenerateContent`` (SSE, one
``GenerateContentResponse`` per event), ``:generateContent`` and ``:countTokens`` on
127.0.0.1 (``tests/standin.py`` has what the stand-ins share: the script, the records, the
server). Each streamed request is a turn: it takes the next scripted ``Turn`` (text, a
function call, or an HTTP error). When the script is empty, the turn is a plain "Done."
Non-streamed calls are the CLI's side calls (routing, checks): they get a short JSON text
and leave the script alone. Every request body is recorded (``requests``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.standin import Reply, ScriptedAPI, not_here

MODEL = "gemini-2.5-pro"


@dataclass
class Turn(Reply):
    """One scripted answer: ``text`` and/or ``calls`` ((function name, args) pairs), or an
    HTTP error (``status`` >= 400 with ``headers`` and ``body``)."""

    text: str | None = None
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    body: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 1000
    output_tokens: int = 50


def text(body: str, **kw: Any) -> Turn:
    return Turn(text=body, **kw)


def call(name: str, args: dict[str, Any], **kw: Any) -> Turn:
    return Turn(calls=[(name, args)], **kw)


def quota(*, per: str = "Day", retry_delay: str | None = None) -> Turn:
    """A 429 for a quota (``per`` Day or Minute), with a RetryInfo delay when given."""
    details: list[dict[str, Any]] = [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [
                {
                    "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                    "quotaId": f"GenerateRequestsPer{per}PerProjectPerModel",
                }
            ],
        }
    ]
    if retry_delay is not None:
        details.append(
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}
        )
    turn = error(429, message="You exceeded your current quota.")
    turn.body["error"]["details"] = details
    return turn


def error(status: int, *, message: str = "", reason: str = "") -> Turn:
    statuses = {400: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL"}
    payload: dict[str, Any] = {
        "code": status,
        "message": message or f"stand-in error {status}",
        "status": statuses.get(status, "UNKNOWN"),
    }
    if reason:
        payload["details"] = [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason}
        ]
    return Turn(status=status, body={"error": payload})


class StandIn(ScriptedAPI[Turn]):
    """The streamed requests are the turns."""

    name = "gemini-standin"

    def function_responses(self) -> list[dict[str, Any]]:
        """Every functionResponse part the model was shown, without repeats."""
        seen: dict[str, dict[str, Any]] = {}
        for body in self.turns():
            for content in body.get("contents", []):
                for part in content.get("parts", []):
                    if isinstance(part, dict) and "functionResponse" in part:
                        seen.setdefault(json.dumps(part, sort_keys=True), part["functionResponse"])
        return list(seen.values())

    def user_texts(self) -> list[str]:
        out: list[str] = []
        turns = self.turns()
        for content in turns[-1].get("contents", []) if turns else []:
            if content.get("role") != "user":
                continue
            for part in content.get("parts", []):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    out.append(part["text"])
        return out

    @staticmethod
    def _response(turn: Turn, model: str) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if turn.text:
            parts.append({"text": turn.text})
        for name, args in turn.calls:
            parts.append({"functionCall": {"name": name, "args": args}})
        return {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {
                "promptTokenCount": turn.prompt_tokens,
                "candidatesTokenCount": turn.output_tokens,
                "totalTokenCount": turn.prompt_tokens + turn.output_tokens,
            },
            "modelVersion": model,
        }

    async def _models(self, request: web.Request) -> web.StreamResponse:
        tail = request.match_info["tail"]
        body = await request.json() if request.can_read_body else {}
        model, _, method = tail.partition(":")
        if method == "countTokens":
            return web.json_response({"totalTokens": 42})
        turn = self.take(body, turn=method == "streamGenerateContent")
        if turn is None and method == "streamGenerateContent":
            turn = Turn(text="Done.")
        elif turn is None:  # routing, checks
            turn = Turn(text='{"reasoning": "stand-in", "next_speaker": "user"}')
        await self.held(turn)
        if turn.status >= 400:
            return web.json_response(turn.body, status=turn.status, headers=turn.headers)
        payload = self._response(turn, model)
        if method != "streamGenerateContent":
            return web.json_response(payload)
        response = web.StreamResponse(
            headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
        )
        await response.prepare(request)
        await response.write(f"data: {json.dumps(payload)}\r\n\r\n".encode())
        await response.write_eof()
        return response

    async def _other(self, request: web.Request) -> web.Response:
        return await not_here(request, {"error": {"code": 404, "message": "not here"}})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1beta/models/{tail:.*}", self._models)
        app.router.add_route("*", "/{tail:.*}", self._other)
        return app


#: ``with standin(*turns) as api``: a stand-in scripted with ``turns``, running.
standin = StandIn.serving
