"""The Claude Code adapter: ``claude -p --output-format stream-json --input-format stream-json
--verbose`` (REFERENCE.md §3), one JSON object per line each way, stdin kept open.

What each output line becomes:

    system/init              SessionId, ModelName, Activity("starting", model)
    system/api_retry         Retrying (attempt, delay, error): alive, not stalled
    rate_limit_event         remembered until the turn's result (claude_limits.py)
    assistant                Usage; ToolUse and Activity per block: tool name + input
                             summary, text snippet;
                             a tool_use of AskUserQuestion becomes an Ask (key: tool_use id),
                             unless ``permission_prompt_tool="stdio"`` says its can_use_tool
                             request will follow (then that request asks)
    control_request          can_use_tool: an Ask of type permission (key: request_id),
                             or, for AskUserQuestion, the route its answer must take
    user tool_result         for an AskUserQuestion Claude already settled (headless Claude
                             dismisses it when nobody can be asked): the Ask's answer will go
                             as a plain user message instead
    user (isReplay)          a message gridd sent has been taken up (--replay-user-messages)
    result                   Cost(total_cost_usd, or the older cost_usd), Usage, at most one
                             RateLimited (structured signals first, claude_limits.py), Result
    a usage-limit notice     RateLimited (a non-JSON line; exact phrasings only)
    stream_event, control_response, keep_alive, other system subtypes: nothing
    a type not named here    a newer CLI's: logged once at debug level, and nothing it
                             carries is read (not even its session_id)
    anything else            Malformed if not a JSON object (at most one warning per
                             ``MALFORMED_EVERY`` bad lines), never an exception

The CLI waits for the next user message after ``result``: ``ends_on_result`` and ``idle()``
tell the pool when the conversation is over (the turn ended and every message gridd sent has
been replayed back, so none is still queued), and it closes stdin. ``extra_args`` adds
``--replay-user-messages`` and the profile's permission policy (``permission_mode``,
``allowed_tools``, ``disallowed_tools``).

The answer shapes (``claude_protocol.py`` builds them) follow the Claude Agent SDK: the CLI's
``control_request``/``control_response`` exchange as in anthropics/claude-agent-sdk-python
``_internal/query.py`` (``_handle_control_request``) and vibe-kanban's
``crates/executors/src/executors/claude/{types,protocol}.rs``; AskUserQuestion answers as in
the SDK guide "Handle approvals and user input" (``updatedInput = {questions, answers}``).
"""

from __future__ import annotations

import json
from typing import Any

from gridd.adapters import claude_limits as limits
from gridd.adapters import claude_protocol as protocol
from gridd.adapters.base import (
    Activity,
    Adapter,
    Ask,
    Cost,
    Malformed,
    ModelName,
    Nudge,
    Result,
    SessionId,
    Signal,
    ToolUse,
    Unknown,
    Usage,
)
from gridd.adapters.beat import Beat
from gridd.adapters.lines import LineSplitter, Overlong
from gridd.adapters.ratelimit import detect_rate_limit

MALFORMED_EVERY = 100
MAX_LINE = 16 * 1024 * 1024  # a tool_result line may carry a whole file


PERMISSION_MODES = ("default", "acceptEdits", "plan", "bypassPermissions")
#: The message types read or knowingly skipped; any other is a newer CLI's (``Unknown``).
KNOWN = frozenset(
    {
        "system",
        "rate_limit_event",
        "assistant",
        "user",
        "control_request",
        "control_cancel_request",
        "result",
        "stream_event",
        "control_response",
        "keep_alive",
    }
)
#: What a nudge says: Claude takes it as the next user message of the same session.
NUDGE_TEXT = "continue"


class ClaudeAdapter(Adapter):
    """Parses Claude Code's stream-json output; encodes answers as stream-json input."""

    name = "claude"
    ends_on_result = True

    def __init__(
        self,
        *,
        permission_prompt_tool: str | None = None,
        permission_mode: str | None = None,
        allowed_tools: list[str] | None = None,
        disallowed_tools: list[str] | None = None,
        stall_nudge: bool = True,
    ) -> None:
        self._stall_nudge = stall_nudge
        self._permission_mode = permission_mode
        self._allowed = list(allowed_tools or [])
        self._disallowed = list(disallowed_tools or [])
        self._sent = 0  # plain user messages written (prompt, follow-ups)
        self._replayed = 0  # ... and echoed back as taken up
        self._replays = False  # the CLI replays them (--replay-user-messages) at all
        self._turn_over = False  # the last line of note was a result
        self._limit: limits.LimitInfo | None = None  # the turn's rejected rate_limit_event
        self._retry_delay: float | None = None  # the turn's last 429 retry delay
        self._tokens = (0, 0)  # input, output tokens of the run's turns
        # With ``--permission-prompt-tool stdio`` every AskUserQuestion also comes as a
        # can_use_tool request: ask then, so an answer never races ahead of it as a
        # tool_result the CLI is not waiting for.
        self._control_questions = permission_prompt_tool == "stdio"
        self._lines = LineSplitter(max_line=MAX_LINE)
        self._session: str | None = None
        self._routes: dict[str, dict[str, Any]] = {}  # open Ask key -> how to answer it
        self._asked: set[str] = set()
        self._bad = 0
        self._unknown = Unknown(self.name)

    def initial_input(self, prompt: str) -> str | None:
        self._sent += 1
        return protocol.user_message(prompt)

    def encode_follow_up(self, text: str) -> str | None:
        self._sent += 1
        self._turn_over = False
        return protocol.user_message(text)

    def idle(self) -> bool:
        if not self._turn_over or self._routes:
            return False
        return not self._replays or self._replayed >= self._sent

    def extra_args(self, argv: list[str]) -> list[str]:
        extra: list[str] = []
        if "--replay-user-messages" not in argv:
            extra.append("--replay-user-messages")
        if self._permission_mode and "--permission-mode" not in argv:
            extra += ["--permission-mode", self._permission_mode]
        if self._allowed:
            extra += ["--allowedTools", ",".join(self._allowed)]
        if self._disallowed:
            extra += ["--disallowedTools", ",".join(self._disallowed)]
        return extra

    def resume_args(self, argv: list[str], session_id: str) -> list[str]:
        return [*argv, "--resume", session_id]

    def feed_output(self, text: str) -> list[Signal]:
        return [signal for line in self._lines.feed(text) for signal in self._line(line)]

    def feed_eof(self) -> list[Signal]:
        return [signal for line in self._lines.flush() for signal in self._line(line)]

    def feed_heartbeat(self, beat: Beat) -> list[Signal]:
        """Heartbeats (e.g. from Claude Code hooks) are shown; ``continue`` nudges claude
        on in the same session with a "continue" message."""
        signals: list[Signal] = [Activity(beat.label or beat.status, beat.message)]
        if beat.status == "continue":
            signals.append(Nudge(NUDGE_TEXT))
        return signals

    def stall_nudge(self) -> str | None:
        return NUDGE_TEXT if self._stall_nudge else None

    def auto_answer(self, ask: Ask) -> str | None:
        return None

    def encode_answer(self, ask: Ask, response: str) -> str:
        meta = self._routes.get(ask.key, ask.meta)
        line = protocol.encode_answer(meta, response)  # may raise ValidationFailed
        self._routes.pop(ask.key, None)
        if meta.get("route") == "message":
            self._sent += 1  # a plain user message: it is replayed like a follow-up
            self._turn_over = False
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
        kind, subtype = obj.get("type"), obj.get("subtype")
        if kind not in KNOWN:
            self._unknown.note(str(kind))
            return []
        signals = self._session_change(obj)
        if kind == "system" and subtype == "init":
            model = _str(obj.get("model"))
            signals += [ModelName(model)] if model else []
            signals.append(Activity("starting", model))
        elif kind == "system" and subtype == "api_retry":
            retry = limits.retrying(obj)
            if retry.status == limits.RATE_LIMITED:
                self._retry_delay = retry.delay
            signals.append(retry)
        elif kind == "rate_limit_event":
            info = limits.limit_info(obj)
            if info is not None and info.status == "rejected":
                self._limit = info
        elif kind == "assistant":
            self._turn_over = False
            signals.extend(self._assistant(obj.get("message")))
        elif kind == "user":
            signals.extend(self._user(obj))
        elif kind == "control_request":
            signals.extend(self._control_request(obj))
        elif kind == "control_cancel_request":
            signals.extend(self._control_cancel(obj.get("request_id")))
        elif kind == "result":
            signals.extend(self._result(obj))
        return signals  # stream_event, control_response, ... carry nothing

    def _result(self, obj: dict[str, Any]) -> list[Signal]:
        text = _str(obj.get("result")) or ""
        errors = obj.get("errors")
        if not text and isinstance(errors, list):
            text = "; ".join(str(error) for error in errors)
        signals = self._accounting(obj)
        limited = limits.turn_limit(obj, text, event=self._limit, retry_delay=self._retry_delay)
        self._limit, self._retry_delay = None, None
        if limited is not None:
            signals.append(limited)
        subtype = _str(obj.get("subtype"))
        turns = obj.get("num_turns")
        ok = subtype == "success" and obj.get("is_error") is not True and limited is None
        turns = turns if isinstance(turns, int) and not isinstance(turns, bool) else None
        signals.append(Result(ok=ok, text=text, subtype=subtype, turns=turns))
        self._turn_over = True
        return signals

    def _accounting(self, obj: dict[str, Any]) -> list[Signal]:
        """A result's cost (``total_cost_usd``, or the older ``cost_usd``: the session's
        running total) and tokens (the turn's own, added up here)."""
        signals: list[Signal] = []
        cost = obj.get("total_cost_usd", obj.get("cost_usd"))
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
            signals.append(Cost(float(cost)))
        usage = obj.get("usage")
        if isinstance(usage, dict):
            tokens = [usage.get(k) for k in ("input_tokens", "output_tokens")]
            if all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
                self._tokens = (
                    self._tokens[0] + int(tokens[0] or 0),
                    self._tokens[1] + int(tokens[1] or 0),
                )
                signals.append(Usage(*self._tokens))
        return signals

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
                # A limit notice here is repeated by the result, which reports it (once).
                signals.append(Activity("text", protocol.snippet(block["text"])))
            elif block.get("type") == "thinking":
                signals.append(Activity("thinking"))
            elif block.get("type") == "tool_use" and isinstance(block.get("name"), str):
                tool_input = protocol.as_dict(block.get("input"))
                if block["name"] == protocol.ASK_TOOL:
                    signals.extend(self._ask_tool_use(block.get("id"), tool_input))
                else:
                    summary = protocol.summarize(tool_input)
                    signals.append(ToolUse(block["name"], summary or None))
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

    def _user(self, obj: dict[str, Any]) -> list[Signal]:
        message = obj.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if obj.get("isReplay") is True and not isinstance(content, list):
            self._replays = True
            self._replayed += 1
            return []
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
        ask = protocol.permission_ask(
            request_id, tool, tool_input, tool_use_id, request.get("permission_suggestions")
        )
        self._routes[request_id] = dict(ask.meta)
        return [ask]

    def _control_cancel(self, request_id: object) -> list[Signal]:
        for key, route in list(self._routes.items()):
            if route.get("request_id") == request_id and route.get("route") == "control":
                del self._routes[key]
                return [Activity("question withdrawn by claude", key)]
        return []


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None
