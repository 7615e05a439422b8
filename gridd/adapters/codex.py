"""The Codex CLI adapter: ``codex exec --json`` (one JSON event per line on stdout; stdin is
not read: the profile gives it /dev/null, as codex waits for stdin to close before it starts).

What each event becomes:

    thread.started           SessionId (thread_id), Activity("starting", model)
    turn.started             Activity("thinking")
    item.started             command_execution, file_change, mcp_tool_call, web_search:
                             ToolUse and Activity (the command, the paths, server.tool, query)
    item.completed           those: ToolUse(None); agent_message: Activity("text");
                             reasoning: Activity("thinking"); error (a warning): Activity
    item.updated             todo_list: Activity("plan")
    error                    Activity("error"); a usage limit or a 429 given up on is
                             remembered for the turn's end (codex retries on its own before)
    turn.completed           Usage (input, output tokens, added up over the run's turns),
                             Cost from the price table (prices.py; codex reports no dollars),
                             Result(ok)
    turn.failed              at most one RateLimited, then Result(not ok, the message)
    a usage-limit line       RateLimited (prose on stderr, outside --json)
    other JSON               an unknown type: logged once at debug level, ignored

A finished turn ends the run: ``ends_on_result`` with ``idle()`` after ``turn.completed``
or ``turn.failed`` (codex exits by itself; the pool stops it if it lingers).

Rate limits: codex turns the API's 429 into prose. A plan's usage limit says "You've hit
your usage limit. ... try again at 3:05 PM." (or "Sep 26th, 2026 3:05 PM"), local time, to
the minute (codex truncates): it is parked to the end of that minute. A plain 429 that its
retries did not get past ("exceeded retry limit, last status: 429 ...") has no reset time.

The session resumes with ``codex exec [options] resume <thread_id> <prompt>``
(``resume_args``). Codex reports tokens, never the model: ``extra_args`` reads ``-m`` /
``--model`` / ``-c model=...`` from the command, or adds the adapter's ``model`` option.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta
from typing import Any

from gridd.adapters.base import (
    Activity,
    Cost,
    ModelName,
    RateLimited,
    Result,
    SessionId,
    Signal,
    ToolUse,
    Usage,
)
from gridd.adapters.claude_protocol import snippet
from gridd.adapters.jsonlines import JsonLinesAdapter, as_count, as_str
from gridd.adapters.prices import cost_usd, price_of

_USAGE_LIMIT = re.compile(
    r"You[\u2019']ve hit your usage limit\..*?(?:[Tt]ry again at (?P<when>[^.]+?)\.|[Tt]ry again later\.)"
)
_RETRY_429 = re.compile(r"exceeded retry limit, last status: 429\b.*")
_CLOCK = re.compile(r"(?P<hour>\d{1,2}):(?P<minute>\d{2}) ?(?P<ampm>[AaPp][Mm])")
_DATE = re.compile(r"(?P<month>[A-Z][a-z]{2}) (?P<day>\d{1,2})(?:st|nd|rd|th)?, (?P<year>\d{4}) ")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_TOOLS = {
    "command_execution": "shell",
    "file_change": "edit",
    "mcp_tool_call": "mcp",
    "web_search": "web_search",
}
_KNOWN = frozenset(
    {
        "thread.started",
        "turn.started",
        "turn.completed",
        "turn.failed",
        "item.started",
        "item.updated",
        "item.completed",
        "error",
    }
)


class CodexAdapter(JsonLinesAdapter):
    """Parses ``codex exec --json``; codex takes no input after its start."""

    name = "codex"
    KNOWN = _KNOWN

    def __init__(self, *, model: str | None = None) -> None:
        super().__init__()
        self._model = model
        self._session: str | None = None
        self._tokens = (0, 0, 0)  # input, cached input, output over the run's turns
        self._last_text = ""
        self._limit: RateLimited | None = None  # the turn's rate limit, said by an error

    # -- the command -----------------------------------------------------------------------

    def extra_args(self, argv: list[str]) -> list[str]:
        named = _model_in(argv)
        if named:
            self._model = named
            return []
        return ["-m", self._model] if self._model else []

    def adopt(self, argv: list[str]) -> None:
        """The model, for the price: codex's output never names it."""
        self._model = _model_in(argv) or self._model

    def resume_args(self, argv: list[str], session_id: str) -> list[str]:
        """``codex exec [options] resume <id> <prompt>``: the prompt is the last argument."""
        if len(argv) < 2 or "exec" not in argv:
            return argv
        return [*argv[:-1], "resume", session_id, argv[-1]]

    def plain(self, text: str) -> list[Signal]:
        limited = codex_rate_limit(text)
        return [limited] if limited is not None else []  # stderr's logs

    def event(self, obj: dict[str, Any]) -> list[Signal]:
        kind = obj.get("type")
        if kind == "thread.started":
            return self._thread(obj.get("thread_id"))
        if kind == "turn.started":
            self._turn_over = False
            return [Activity("thinking")]
        if kind in ("item.started", "item.updated", "item.completed"):
            item = obj.get("item")
            return self._item(str(kind), item) if isinstance(item, dict) else []
        if kind == "error":
            message = as_str(obj.get("message")) or "error"
            self._limit = codex_rate_limit(message) or self._limit
            return [Activity("error", snippet(message))]
        if kind == "turn.completed":
            return self._completed(obj.get("usage"))
        if kind == "turn.failed":
            return self._failed(obj.get("error"))
        return []

    def _thread(self, thread_id: object) -> list[Signal]:
        signals: list[Signal] = []
        if isinstance(thread_id, str) and thread_id and thread_id != self._session:
            self._session = thread_id
            signals.append(SessionId(thread_id))
        if self._model:
            signals.append(ModelName(self._model))
        signals.append(Activity("starting", self._model))
        return signals

    def _item(self, kind: str, item: dict[str, Any]) -> list[Signal]:
        item_type = item.get("type")
        tool = _TOOLS.get(str(item_type))
        if tool is not None:
            summary = _tool_summary(str(item_type), item)
            name = _mcp_name(item) if item_type == "mcp_tool_call" else tool
            if kind == "item.started":
                return [ToolUse(name, summary or None), Activity(name, summary or None)]
            if kind == "item.completed":
                status = as_str(item.get("status"))
                return [ToolUse(None), Activity(f"{name} {status or 'done'}", summary or None)]
            return []
        if kind != "item.completed" and item_type != "todo_list":
            return []
        if item_type == "agent_message":
            self._last_text = as_str(item.get("text")) or self._last_text
            return [Activity("text", snippet(self._last_text))]
        if item_type == "reasoning":
            return [Activity("thinking", snippet(as_str(item.get("text")) or "") or None)]
        if item_type == "todo_list":
            items = item.get("items")
            count = len(items) if isinstance(items, list) else 0
            return [Activity("plan", f"{count} steps")]
        if item_type == "error":
            return [Activity("warning", snippet(as_str(item.get("message")) or ""))]
        return []

    def _completed(self, usage: object) -> list[Signal]:
        self._turn_over = True
        self._limit = None
        signals: list[Signal] = []
        if isinstance(usage, dict):
            got = [as_count(usage.get(k)) for k in ("input_tokens", "cached_input_tokens")]
            out = as_count(usage.get("output_tokens"))
            self._tokens = (
                self._tokens[0] + got[0],
                self._tokens[1] + got[1],
                self._tokens[2] + out,
            )
            signals.append(Usage(self._tokens[0], self._tokens[2]))
            price = price_of(self._model)
            if price is not None:
                usd = cost_usd(
                    price,
                    input_tokens=self._tokens[0],
                    cached_tokens=self._tokens[1],
                    output_tokens=self._tokens[2],
                )
                signals.append(Cost(usd))
        signals.append(Result(ok=True, text=self._last_text, subtype="turn.completed"))
        return signals

    def _failed(self, error: object) -> list[Signal]:
        self._turn_over = True
        message = as_str(error.get("message")) if isinstance(error, dict) else None
        message = _readable(message or "the turn failed")
        limited = codex_rate_limit(message) or self._limit
        self._limit = None
        signals: list[Signal] = [limited] if limited is not None else []
        signals.append(Result(ok=False, text=message, subtype="turn.failed"))
        return signals


def codex_rate_limit(text: str, *, now: float | None = None) -> RateLimited | None:
    """A ``RateLimited`` when ``text`` is Codex's usage-limit notice or its 429 give-up."""
    match = _USAGE_LIMIT.search(text)
    if match:
        when = match["when"]
        at = codex_reset_time(when, now=time.time() if now is None else now) if when else None
        return RateLimited(message=text, resets_at=at, limit_type="usage_limit", source="message")
    match = _RETRY_429.search(text)
    if match:
        return RateLimited(message=text, resets_at=None, limit_type="api_key", source="none")
    return None


def codex_reset_time(text: str, *, now: float) -> float | None:
    """Epoch seconds for codex's "3:05 PM" (today, local time, or tomorrow if that has
    passed) or "Sep 26th, 2026 3:05 PM"; the end of that minute, as codex drops the seconds."""
    text = text.strip()
    date = _DATE.match(text)
    clock = _CLOCK.fullmatch(text[date.end() :] if date else text)
    if clock is None:
        return None
    hour, minute = int(clock["hour"]), int(clock["minute"])
    if not 1 <= hour <= 12 or minute > 59:
        return None
    hour = hour % 12 + (12 if clock["ampm"].lower() == "pm" else 0)
    current = datetime.fromtimestamp(now).astimezone()
    try:
        if date:
            month = _MONTHS.index(date["month"].lower()) + 1
            moment = current.replace(
                year=int(date["year"]), month=month, day=int(date["day"]), hour=hour
            )
        else:
            moment = current.replace(hour=hour)
    except ValueError:
        return None
    moment = moment.replace(minute=minute, second=0, microsecond=0) + timedelta(minutes=1)
    if not date and moment.timestamp() < now - 60:
        moment += timedelta(days=1)  # a time already past today means tomorrow's
    return moment.timestamp()


def _readable(message: str) -> str:
    """An API error body codex passes on as it came (``{"error": {"message", "type"}}``)
    said as its type and message; any other text as it is."""
    try:
        body = json.loads(message)
    except ValueError:
        return message
    error = body.get("error") if isinstance(body, dict) else None
    text = as_str(error.get("message")) if isinstance(error, dict) else None
    if not text or not isinstance(error, dict):
        return message
    kind = as_str(error.get("type"))
    return f"{kind}: {text}" if kind else text


def _model_in(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg in ("-m", "--model"):
            return argv[i + 1]
        if arg in ("-c", "--config") and argv[i + 1].replace(" ", "").startswith("model="):
            return argv[i + 1].split("=", 1)[1].strip().strip("\"'")
    for arg in argv:
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None


def _tool_summary(item_type: str, item: dict[str, Any]) -> str:
    if item_type == "command_execution":
        return snippet(as_str(item.get("command")) or "", 120)
    if item_type == "file_change":
        changes = item.get("changes")
        paths = (
            [str(c.get("path")) for c in changes if isinstance(c, dict) and c.get("path")]
            if isinstance(changes, list)
            else []
        )
        return snippet(", ".join(paths), 120)
    if item_type == "web_search":
        return snippet(as_str(item.get("query")) or "", 120)
    return ""


def _mcp_name(item: dict[str, Any]) -> str:
    server, tool = as_str(item.get("server")), as_str(item.get("tool"))
    return ".".join(part for part in (server, tool) if part) or "mcp"
