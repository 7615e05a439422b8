"""The Claude Code adapter: ``claude -p --output-format stream-json --input-format stream-json
--verbose`` (REFERENCE.md §3), one JSON object per line each way, stdin kept open.

What each output line becomes:

    system/init              SessionId, Activity("starting", model)
    assistant                Activity per block: tool name + input summary, text snippet;
                             a tool_use of AskUserQuestion becomes an Ask (key: tool_use id),
                             unless ``permission_prompt_tool="stdio"`` says its can_use_tool
                             request will follow (then that request asks)
    control_request          can_use_tool: an Ask of type permission (key: request_id),
                             or, for AskUserQuestion, the route its answer must take
    user tool_result         for an AskUserQuestion Claude already settled (headless Claude
                             dismisses it when nobody can be asked): the Ask's answer will go
                             as a plain user message instead
    result                   Cost(total_cost_usd, or the older cost_usd), Result
    a usage-limit notice     RateLimited (exact phrasings only, see ratelimit.py)
    anything else            ignored if it is a JSON object; Malformed if not (at most one
                             warning per ``MALFORMED_EVERY`` bad lines), never an exception

The answer shapes (``claude_protocol.py`` builds them) follow the Claude Agent SDK: the CLI's
``control_request``/``control_response`` exchange as in anthropics/claude-agent-sdk-python
``_internal/query.py`` (``_handle_control_request``) and vibe-kanban's
``crates/executors/src/executors/claude/{types,protocol}.rs``; AskUserQuestion answers as in
the SDK guide "Handle approvals and user input" (``updatedInput = {questions, answers}``).
"""

from __future__ import annotations

import json
from typing import Any

from gridd.adapters import claude_protocol as protocol
from gridd.adapters.base import (
    Activity,
    Ask,
    Cost,
    Malformed,
    Result,
    SessionId,
    Signal,
)
from gridd.adapters.lines import LineSplitter, Overlong
from gridd.adapters.ratelimit import detect_rate_limit
from gridd.agents.heartbeat import Beat

MALFORMED_EVERY = 100
MAX_LINE = 16 * 1024 * 1024  # a tool_result line may carry a whole file


class ClaudeAdapter:
    """Parses Claude Code's stream-json output; encodes answers as stream-json input."""

    name = "claude"

    def __init__(self, *, permission_prompt_tool: str | None = None) -> None:
        # With ``--permission-prompt-tool stdio`` every AskUserQuestion also comes as a
        # can_use_tool request: ask then, so an answer never races ahead of it as a
        # tool_result the CLI is not waiting for.
        self._control_questions = permission_prompt_tool == "stdio"
        self._lines = LineSplitter(max_line=MAX_LINE)
        self._session: str | None = None
        self._routes: dict[str, dict[str, Any]] = {}  # open Ask key -> how to answer it
        self._asked: set[str] = set()
        self._bad = 0

    def initial_input(self, prompt: str) -> str | None:
        return protocol.user_message(prompt)

    def feed_output(self, text: str) -> list[Signal]:
        return [signal for line in self._lines.feed(text) for signal in self._line(line)]

    def feed_eof(self) -> list[Signal]:
        return [signal for line in self._lines.flush() for signal in self._line(line)]

    def feed_heartbeat(self, beat: Beat) -> list[Signal]:
        return [Activity(beat.label or beat.status, beat.message)]

    def auto_answer(self, ask: Ask) -> str | None:
        return None

    def encode_answer(self, ask: Ask, response: str) -> str:
        meta = self._routes.get(ask.key, ask.meta)
        line = protocol.encode_answer(meta, response)  # may raise ValidationFailed
        self._routes.pop(ask.key, None)
        return line

    def _line(self, line: str | Overlong) -> list[Signal]:
        if isinstance(line, Overlong):
            return self._malformed(f"a {line.length}-character line was skipped (too long)")
        text = line.strip()
        if not text:
            return []
        if not text.startswith("{"):
            limited = detect_rate_limit(text)
            return [limited] if limited else self._malformed(f"not JSON: {text[:80]!r}")
        try:
            obj = json.loads(text)
        except ValueError:
            return self._malformed(f"invalid or truncated JSON: {text[:80]!r}")
        if not isinstance(obj, dict):
            return self._malformed(f"not a JSON object: {text[:80]!r}")
        signals = self._session_change(obj)
        kind = obj.get("type")
        if kind == "system" and obj.get("subtype") == "init":
            signals.append(Activity("starting", _str(obj.get("model"))))
        elif kind == "assistant":
            signals.extend(self._assistant(obj.get("message")))
        elif kind == "user":
            signals.extend(self._user(obj.get("message")))
        elif kind == "control_request":
            signals.extend(self._control_request(obj))
        elif kind == "control_cancel_request":
            signals.extend(self._control_cancel(obj.get("request_id")))
        elif kind == "result":
            signals.extend(_result(obj))
        return signals  # other types (stream_event, control_response, ...) carry nothing

    def _malformed(self, message: str) -> list[Signal]:
        self._bad += 1
        if self._bad == 1 or self._bad % MALFORMED_EVERY == 0:
            return [Malformed(f"claude output: {message} ({self._bad} unusable lines so far)")]
        return []

    def _session_change(self, obj: dict[str, Any]) -> list[Signal]:
        session = obj.get("session_id")
        if isinstance(session, str) and session and session != self._session:
            self._session = session
            return [SessionId(session)]
        return []

    def _assistant(self, message: object) -> list[Signal]:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            return []
        signals: list[Signal] = []
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                limited = detect_rate_limit(block["text"])
                signals.append(limited or Activity("text", protocol.snippet(block["text"])))
            elif block.get("type") == "thinking":
                signals.append(Activity("thinking"))
            elif block.get("type") == "tool_use" and isinstance(block.get("name"), str):
                tool_input = protocol.as_dict(block.get("input"))
                if block["name"] == protocol.ASK_TOOL:
                    signals.extend(self._ask_tool_use(block.get("id"), tool_input))
                else:
                    summary = protocol.summarize(tool_input)
                    signals.append(Activity(block["name"], summary or None))
        return signals

    def _ask_tool_use(self, tool_use_id: object, tool_input: dict[str, Any]) -> list[Signal]:
        if not isinstance(tool_use_id, str) or not tool_use_id:
            return [Malformed("claude output: AskUserQuestion without a tool_use id")]
        if tool_use_id in self._asked:
            return []  # its control request came first and asked already
        if self._control_questions:
            return [Activity(protocol.ASK_TOOL, "waiting for its permission request")]
        route = {"route": "tool_result", "tool_use_id": tool_use_id}
        return self._ask_question(tool_use_id, tool_input, route)

    def _ask_question(
        self, key: str, tool_input: dict[str, Any], route: dict[str, Any]
    ) -> list[Signal]:
        ask = protocol.question_ask(key, tool_input, route)
        if ask is None:
            return [Malformed("claude output: AskUserQuestion without any question")]
        self._asked.add(key)
        self._routes[key] = dict(ask.meta)
        return [ask]

    def _user(self, message: object) -> list[Signal]:
        content = message.get("content") if isinstance(message, dict) else None
        signals: list[Signal] = []
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            key = block.get("tool_use_id")
            route = self._routes.get(key) if isinstance(key, str) else None
            if route is not None and route.get("route") == "tool_result":
                # Claude settled the question itself; an answer now goes as a new message.
                route["route"] = "message"
                signals.append(Activity("question dismissed by claude", str(key)))
        return signals

    def _control_request(self, obj: dict[str, Any]) -> list[Signal]:
        request_id, request = obj.get("request_id"), obj.get("request")
        if not isinstance(request_id, str) or not request_id or not isinstance(request, dict):
            return self._malformed("control_request without request_id or request")
        subtype = request.get("subtype")
        tool = request.get("tool_name")
        if subtype != "can_use_tool" or not isinstance(tool, str):
            # Nothing here registers hooks or SDK MCP servers, so nothing else should come.
            return [Malformed(f"claude output: unsupported control request {subtype!r}")]
        tool_input = protocol.as_dict(request.get("input"))
        tool_use_id = request.get("tool_use_id")
        control = {"route": "control", "request_id": request_id, "input": tool_input}
        if tool == protocol.ASK_TOOL:
            key = tool_use_id if isinstance(tool_use_id, str) and tool_use_id else request_id
            if key in self._asked:
                if key in self._routes:
                    self._routes[key].update(control)  # same question, answered this way now
                return []
            return self._ask_question(key, tool_input, control)
        if request_id in self._asked:
            return []
        self._asked.add(request_id)
        ask = protocol.permission_ask(request_id, tool, tool_input, tool_use_id)
        self._routes[request_id] = dict(ask.meta)
        return [ask]

    def _control_cancel(self, request_id: object) -> list[Signal]:
        for key, route in list(self._routes.items()):
            if route.get("request_id") == request_id and route.get("route") == "control":
                del self._routes[key]
                return [Activity("question withdrawn by claude", key)]
        return []


def _result(obj: dict[str, Any]) -> list[Signal]:
    signals: list[Signal] = []
    cost = obj.get("total_cost_usd", obj.get("cost_usd"))
    if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
        signals.append(Cost(float(cost)))
    text = _str(obj.get("result")) or ""
    errors = obj.get("errors")
    if not text and isinstance(errors, list):
        text = "; ".join(str(error) for error in errors)
    limited = detect_rate_limit(text) if text else None
    if limited is not None:
        signals.append(limited)
    subtype = _str(obj.get("subtype"))
    turns = obj.get("num_turns")
    ok = subtype == "success" and obj.get("is_error") is not True
    turns = turns if isinstance(turns, int) and not isinstance(turns, bool) else None
    signals.append(Result(ok=ok, text=text, subtype=subtype, turns=turns))
    return signals


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None
