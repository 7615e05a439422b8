"""The opencode adapter: ``opencode run --format json --dir <worktree> <prompt>`` (one JSON
event per line on stdout; stdin is not read: the profile gives it /dev/null).

What each event becomes (every event carries the ``sessionID``: the first gives SessionId):

    step_start               Activity("thinking")
    text                     Activity("text"), its text the result's
    reasoning                Activity("thinking")
    tool_use                 a tool's state: running or pending gives ToolUse and Activity
                             (the tool and its command, path, ...), completed or error gives
                             ToolUse(None) and Activity("<tool> <status>")
    step_finish              Usage and Cost, added up over the run's steps (opencode prices
                             each step itself, from its model catalogue); a step that did not
                             end for tool calls ends the turn: Result(ok)
    error                    at most one RateLimited (a 429, its reset from the response's
                             retry-after or reset headers), Result(not ok, "<name>: message")
    other JSON               an unknown type: logged once at debug level, ignored

opencode takes its directory from ``$PWD``, not from its working directory: the profile
passes ``--dir {worktree}``. It waits out a retryable 429 by itself; only one it gives up on
reaches gridd. The session resumes with ``--session <id>`` (``resume_args``).
"""

from __future__ import annotations

from typing import Any

from gridd.adapters.base import (
    Activity,
    Cost,
    RateLimited,
    Result,
    SessionId,
    Signal,
    ToolUse,
    Usage,
)
from gridd.adapters.claude_protocol import snippet, summarize
from gridd.adapters.jsonlines import JsonLinesAdapter, as_count, as_str
from gridd.adapters.ratelimit import parse_timestamp

_RESET_HEADERS = ("anthropic-ratelimit-unified-reset", "x-ratelimit-reset-requests")


class OpencodeAdapter(JsonLinesAdapter):
    """Parses ``opencode run --format json``; opencode takes no input after its start."""

    name = "opencode"
    KNOWN = frozenset({"step_start", "step_finish", "text", "reasoning", "tool_use", "error"})

    def __init__(self) -> None:
        super().__init__()
        self._session: str | None = None
        self._tokens = (0, 0)
        self._usd = 0.0
        self._priced = False
        self._text = ""

    def resume_args(self, argv: list[str], session_id: str) -> list[str]:
        """``--session <id>`` before the prompt, the last argument."""
        if len(argv) < 2:
            return argv
        return [*argv[:-1], "--session", session_id, argv[-1]]

    def event(self, obj: dict[str, Any]) -> list[Signal]:
        signals = self._session_of(obj)
        kind = obj.get("type")
        part = obj.get("part") if isinstance(obj.get("part"), dict) else {}
        assert isinstance(part, dict)
        if kind == "step_start":
            self._turn_over = False
            signals.append(Activity("thinking"))
        elif kind == "text":
            self._text = as_str(part.get("text")) or self._text
            signals.append(Activity("text", snippet(self._text)))
        elif kind == "reasoning":
            signals.append(Activity("thinking", snippet(as_str(part.get("text")) or "") or None))
        elif kind == "tool_use":
            signals.extend(self._tool(part))
        elif kind == "step_finish":
            signals.extend(self._step_finish(part))
        elif kind == "error":
            signals.extend(self._error(obj))
        return signals

    def _session_of(self, obj: dict[str, Any]) -> list[Signal]:
        session = as_str(obj.get("sessionID"))
        if session and session != self._session:
            self._session = session
            return [SessionId(session)]
        return []

    def _tool(self, part: dict[str, Any]) -> list[Signal]:
        name = as_str(part.get("tool")) or "tool"
        state = part.get("state") if isinstance(part.get("state"), dict) else {}
        assert isinstance(state, dict)
        status = as_str(state.get("status")) or "completed"
        tool_input = state.get("input")
        summary = summarize(tool_input) if isinstance(tool_input, dict) else ""
        if status in ("pending", "running"):
            return [ToolUse(name, summary or None), Activity(name, summary or None)]
        return [ToolUse(None), Activity(f"{name} {status}", summary or None)]

    def _step_finish(self, part: dict[str, Any]) -> list[Signal]:
        signals: list[Signal] = []
        tokens = part.get("tokens")
        if isinstance(tokens, dict):
            cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else {}
            assert isinstance(cache, dict)
            got_in = as_count(tokens.get("input")) + as_count(cache.get("read"))
            got_in += as_count(cache.get("write"))
            got_out = as_count(tokens.get("output")) + as_count(tokens.get("reasoning"))
            self._tokens = (self._tokens[0] + got_in, self._tokens[1] + got_out)
            signals.append(Usage(*self._tokens))
        cost = part.get("cost")
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
            self._usd += float(cost)
            self._priced = True
        if self._priced:
            signals.append(Cost(self._usd))
        reason = as_str(part.get("reason")) or ""
        if reason not in ("tool-calls", "tool_calls"):
            self._turn_over = True
            signals.append(Result(ok=True, text=self._text, subtype=reason or None))
        return signals

    def _error(self, obj: dict[str, Any]) -> list[Signal]:
        self._turn_over = True
        error = obj.get("error") if isinstance(obj.get("error"), dict) else {}
        assert isinstance(error, dict)
        data = error.get("data") if isinstance(error.get("data"), dict) else {}
        assert isinstance(data, dict)
        name = as_str(error.get("name")) or "error"
        message = as_str(data.get("message")) or name
        text = f"{name}: {message}" if name != message else message
        signals: list[Signal] = []
        if data.get("statusCode") == 429:
            signals.append(_limited(text, data, obj.get("timestamp")))
        signals.append(Result(ok=False, text=text, subtype=name))
        return signals


def _limited(text: str, data: dict[str, Any], timestamp: object) -> RateLimited:
    """A 429 opencode gave up on: its reset from the response's headers, when they say."""
    headers = data.get("responseHeaders")
    headers = {str(k).lower(): v for k, v in headers.items()} if isinstance(headers, dict) else {}
    for key in _RESET_HEADERS:
        at = parse_timestamp(headers.get(key))
        if at is not None:
            return RateLimited(message=text, resets_at=at, limit_type="api_key", source=key)
    after = parse_timestamp(headers.get("retry-after"))
    said = parse_timestamp(timestamp)
    if after is not None and said is not None:
        return RateLimited(
            message=text, resets_at=said + after, limit_type="api_key", source="retry-after"
        )
    return RateLimited(message=text, resets_at=None, limit_type="api_key", source="none")
