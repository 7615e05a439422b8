"""The Gemini CLI adapter: ``gemini --output-format stream-json --approval-mode yolo -p
<prompt>`` (one JSON event per line on stdout; stdin is not read: the profile gives it
/dev/null, as the CLI waits for stdin to close before it starts).

What each event becomes:

    init                     ModelName, Activity("starting", model); the session id is
                             kept until the model has answered (a first run that failed
                             saves no session, and resuming it by id would fail)
    message (assistant)      Activity("text"), its text the result's; then the SessionId
    tool_use                 ToolUse and Activity (the tool and its command, path, ...);
                             then the SessionId
    tool_result              ToolUse(None), Activity("<tool> <status>")
    error                    Activity("warning", message) (loop detection and the like)
    result                   Usage and Cost (stats.models: tokens per model, priced by
                             prices.py; the CLI reports no dollars), at most one
                             RateLimited, Result(status == "success")
    "Attempt N failed: ..."  stderr: the CLI retries a 429 or 5xx itself; "Retrying after
    "... Retrying after Xms" Xms" gives Retrying (alive, not stalled)
    other JSON               an unknown type: logged once at debug level, ignored

Rate limits: a quota error ends the run with exit 173 and a result whose message says
"Suggested retry after 400s." when the API sent a RetryInfo delay too long for the CLI to
wait (over 300 s): parked to the result's own timestamp plus that delay. A daily quota
("You have exhausted your daily quota") names no reset time.

The session resumes with ``--resume <session id>`` (``resume_args``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from gridd.adapters.base import (
    Activity,
    Cost,
    ModelName,
    RateLimited,
    Result,
    Retrying,
    SessionId,
    Signal,
    ToolUse,
    Usage,
)
from gridd.adapters.claude_protocol import snippet, summarize
from gridd.adapters.jsonlines import JsonLinesAdapter, as_count, as_str
from gridd.adapters.prices import cost_usd, price_of
from gridd.adapters.ratelimit import parse_timestamp

#: Exit status of the CLI after a quota error (its FatalQuotaError... exit code).
QUOTA_EXIT = 173

_SUGGESTED = re.compile(r"Suggested retry after (?P<seconds>\d+(?:\.\d+)?)s\.")
_QUOTA = re.compile(
    r"exhausted your daily quota|exceeded your current quota|RESOURCE_EXHAUSTED|"
    r"request a quota increase",
)
_ATTEMPT = re.compile(r"^Attempt (?P<attempt>\d+) failed(?: with status (?P<status>\d{3}))?: ")
_RETRY_AFTER = re.compile(r"Retrying after (?P<ms>\d+)ms\.\.\.$")


class GeminiAdapter(JsonLinesAdapter):
    """Parses the Gemini CLI's stream-json; it takes no input after its start."""

    name = "gemini"
    KNOWN = frozenset({"init", "message", "tool_use", "tool_result", "error", "result"})

    def __init__(self) -> None:
        super().__init__()
        self._session: str | None = None
        self._session_said = False
        self._tools: dict[str, str] = {}  # tool_id -> tool name, while it runs
        self._text = ""  # the assistant's last message, in deltas
        self._text_open = False
        self._attempt: tuple[int, str, int | None] | None = None  # a failed attempt, said

    # -- the command -----------------------------------------------------------------------

    def resume_args(self, argv: list[str], session_id: str) -> list[str]:
        return [*argv, "--resume", session_id]

    def idle(self) -> bool:
        """The result ends the run (the CLI exits by itself soon after, 173 after a quota
        error; the pool stops it if it lingers), and the result's verdict is the run's."""
        return self._turn_over

    def event(self, obj: dict[str, Any]) -> list[Signal]:
        kind = obj.get("type")
        if kind == "init":
            return self._init(obj)
        if kind == "message":
            return self._message(obj)
        if kind == "tool_use":
            return self._tool_use(obj)
        if kind == "tool_result":
            return self._tool_result(obj)
        if kind == "error":
            return [Activity("warning", snippet(as_str(obj.get("message")) or ""))]
        if kind == "result":
            return self._result(obj)
        return []

    def _init(self, obj: dict[str, Any]) -> list[Signal]:
        session = as_str(obj.get("session_id"))
        if session and session != self._session:
            self._session, self._session_said = session, False
        model = as_str(obj.get("model"))
        self._turn_over = False
        return [*([ModelName(model)] if model else []), Activity("starting", model)]

    def _answered(self) -> list[Signal]:
        """The model has answered: the session is saved, and can be resumed."""
        if self._session is None or self._session_said:
            return []
        self._session_said = True
        return [SessionId(self._session)]

    def _message(self, obj: dict[str, Any]) -> list[Signal]:
        if obj.get("role") != "assistant":
            self._text_open = False
            return []
        content = as_str(obj.get("content")) or ""
        if obj.get("delta") is True and self._text_open:
            self._text += content
        else:
            self._text = content
        self._text_open = True
        return [*self._answered(), Activity("text", snippet(self._text))]

    def _tool_use(self, obj: dict[str, Any]) -> list[Signal]:
        self._text_open = False
        name = as_str(obj.get("tool_name")) or "tool"
        tool_id = as_str(obj.get("tool_id"))
        if tool_id:
            self._tools[tool_id] = name
        params = obj.get("parameters")
        summary = summarize(params) if isinstance(params, dict) else ""
        return [*self._answered(), ToolUse(name, summary or None), Activity(name, summary or None)]

    def _tool_result(self, obj: dict[str, Any]) -> list[Signal]:
        name = self._tools.pop(as_str(obj.get("tool_id")) or "", "tool")
        status = as_str(obj.get("status")) or "done"
        return [ToolUse(None), Activity(f"{name} {status}")]

    def _result(self, obj: dict[str, Any]) -> list[Signal]:
        signals: list[Signal] = self._accounting(obj.get("stats"))
        ok = obj.get("status") == "success"
        self._turn_over = True
        error = obj.get("error")
        message = as_str(error.get("message")) if isinstance(error, dict) else None
        text = self._text if ok else (_readable(message) if message else "the run failed")
        if not ok and message:
            limited = gemini_rate_limit(message, at=parse_timestamp(obj.get("timestamp")))
            if limited is not None:
                signals.append(limited)
        signals.append(Result(ok=ok, text=text, subtype=as_str(obj.get("status"))))
        return signals

    def _accounting(self, stats: object) -> list[Signal]:
        """The run's tokens per model (``stats.models``), and their price."""
        models = stats.get("models") if isinstance(stats, dict) else None
        if not isinstance(models, dict) or not models:
            if isinstance(stats, dict):
                models = {"": stats}
            else:
                return []
        tokens_in = tokens_out = 0
        usd: float | None = 0.0
        for model, usage in models.items():
            if not isinstance(usage, dict):
                continue
            got_in, got_out = (
                as_count(usage.get("input_tokens")),
                as_count(usage.get("output_tokens")),
            )
            tokens_in, tokens_out = tokens_in + got_in, tokens_out + got_out
            price = price_of(str(model))
            if price is None:
                usd = None if got_in or got_out else usd
            elif usd is not None:
                usd += cost_usd(
                    price,
                    input_tokens=got_in,
                    cached_tokens=as_count(usage.get("cached")),
                    output_tokens=got_out,
                )
        signals: list[Signal] = [Usage(tokens_in, tokens_out)]
        if usd is not None:
            signals.append(Cost(usd))
        return signals

    def plain(self, text: str) -> list[Signal]:
        attempt = _ATTEMPT.match(text)
        if attempt:
            status = int(attempt["status"]) if attempt["status"] else None
            error = text[attempt.end() :]
            if status is None and _QUOTA.search(error):
                status = 429
            self._attempt = (int(attempt["attempt"]), error, status)
        retry = _RETRY_AFTER.search(text)
        if retry and self._attempt is not None:
            number, error, status = self._attempt
            self._attempt = None
            return [
                Retrying(
                    attempt=number,
                    max_retries=None,
                    delay=int(retry["ms"]) / 1000,
                    error=snippet(error),
                    status=status,
                )
            ]
        return []


def gemini_rate_limit(message: str, *, at: float | None) -> RateLimited | None:
    """A ``RateLimited`` when a failed result's ``message`` is a quota error: its reset is
    ``at`` (the result's time) plus the suggested delay, when the message has one."""
    if not _QUOTA.search(message):
        return None
    readable = _readable(message)
    first = readable.splitlines()[0] if readable.strip() else message
    suggested = _SUGGESTED.search(message)
    if suggested and at is not None:
        return RateLimited(
            message=first,
            resets_at=at + float(suggested["seconds"]),
            limit_type="quota",
            source="retry-after",
        )
    daily = "daily quota" in message
    return RateLimited(
        message=first, resets_at=None, limit_type="daily" if daily else "quota", source="none"
    )


def _readable(message: str) -> str:
    """The CLI's "[API Error: <body>]" said as the body's status and message when the body
    is the API's JSON error; the message otherwise, without the wrapper."""
    match = re.match(r"\[API Error: (?P<inner>.*?)\](?P<rest>.*)", message, re.DOTALL)
    if not match:
        return message
    inner = match["inner"]
    try:
        body = json.loads(inner)
    except ValueError:
        return (inner + match["rest"]).strip()
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        status = as_str(error.get("status"))
        return f"{status}: {error['message']}" if status else error["message"]
    return message
