"""The adapter interface: pure, synchronous, one instance per agent run, no I/O.

The pool feeds an adapter every output chunk (stdout and stderr, combined, as text) and
every heartbeat line; the adapter answers with ``Signal``s. When a human answers a
question, ``encode_answer`` gives the exact text to write to the agent's stdin; a message
sent unasked goes through ``encode_follow_up``.
Malformed or truncated input is never fatal: it becomes a ``Malformed`` signal. A message
of a type the adapter does not know (a newer CLI's) is ``Unknown``: logged once, at debug
level, and otherwise ignored, with everything it carries.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from gridd.adapters.beat import Beat


@dataclass(frozen=True)
class Activity:
    """What the agent is doing now (shown, never interpreted)."""

    label: str | None
    message: str | None = None


@dataclass(frozen=True)
class Ask:
    """The agent waits for a human. ``key`` identifies it within this run (for answers).

    ``meta`` may hold ``aliases``: other words a human may answer with, each mapped to the
    option it names (``{"y": "yes"}``); ``free_text: True`` accepts any answer."""

    key: str
    type: str  # permission | decision | clarification | human-verify | human-action
    question: str
    options: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # protocol details for encode_answer


@dataclass(frozen=True)
class Cost:
    """Spend so far in this run, in US dollars (replaces, not adds to, earlier reports)."""

    usd: float


@dataclass(frozen=True)
class SessionId:
    value: str


@dataclass(frozen=True)
class Result:
    """The agent's own final word (e.g. Claude's ``result`` line)."""

    ok: bool
    text: str = ""
    subtype: str | None = None
    turns: int | None = None


@dataclass(frozen=True)
class Continue:
    """The agent asks for another session; ``summary`` carries over to it."""

    summary: str = ""


@dataclass(frozen=True)
class RateLimited:
    """The provider's usage limit is reached; ``resets_at`` is epoch seconds when known.

    ``limit_type`` names the limit when the agent says (Claude's ``five_hour``,
    ``seven_day``, ``seven_day_opus``, ``seven_day_sonnet``; ``api_key`` for an API key's
    429; ``overloaded`` for a 529); ``source`` says where ``resets_at`` came from
    (``rate_limit_event``, ``retry-after``, ``message``, ``heartbeat``, or ``none``)."""

    message: str
    resets_at: float | None = None
    limit_type: str | None = None
    source: str = "message"


@dataclass(frozen=True)
class Retrying:
    """The agent retries a failed API call itself (Claude's ``system/api_retry``): it is
    alive, waiting ``delay`` seconds before attempt ``attempt``."""

    attempt: int
    max_retries: int | None
    delay: float
    error: str
    status: int | None = None


@dataclass(frozen=True)
class Nudge:
    """Send the agent ``text`` as a follow-up now (a ``continue`` heartbeat for an agent
    that takes messages, such as Claude: it goes on in the same session)."""

    text: str


@dataclass(frozen=True)
class Usage:
    """Tokens used so far in this run (replaces earlier reports)."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class ModelName:
    """The model the agent runs (Claude's ``system/init``)."""

    name: str


@dataclass(frozen=True)
class ToolUse:
    """The tool the agent is using now (None: none, the tool finished)."""

    name: str | None
    summary: str | None = None


@dataclass(frozen=True)
class Malformed:
    """Input the adapter could not use (skipped, never fatal)."""

    message: str


class Unknown:
    """The message types a run's output had that its adapter does not know. CLIs add types
    often (a newer version than the adapter was written for), so one is not a warning: it
    is logged once per run and type, at debug level, and nothing it carries is read."""

    log = logging.getLogger("gridd.adapters")

    def __init__(self, adapter: str) -> None:
        self._adapter = adapter
        self._seen: set[str] = set()

    def note(self, kind: str) -> None:
        if kind not in self._seen:
            self._seen.add(kind)
            self.log.debug("%s output: unknown message type %r ignored", self._adapter, kind)


Signal = (
    Activity
    | Ask
    | Cost
    | SessionId
    | Result
    | Continue
    | RateLimited
    | Retrying
    | Nudge
    | Usage
    | ModelName
    | ToolUse
    | Malformed
)


class Adapter(Protocol):
    name: str

    #: True when the agent waits for more input after its ``Result`` (Claude with
    #: ``--input-format stream-json``): the pool ends the run once ``idle()`` says so.
    ends_on_result: bool = False

    def idle(self) -> bool:
        """The last turn ended (a ``Result``) and every message sent has been taken up."""
        return False

    def extra_args(self, argv: list[str]) -> list[str]:
        """Arguments to append to the profile's command (e.g. the permission policy)."""
        return []

    def adopt(self, argv: list[str]) -> None:
        """A run an earlier daemon started with ``argv`` (the command ``extra_args`` saw
        then) is watched again: learn from it what the run's output will not say."""
        return None

    def resume_args(self, argv: list[str], session_id: str) -> list[str]:
        """The command ``argv`` made to resume the CLI's session ``session_id`` (a
        continuation, feedback, a rate limit's end), or ``argv`` when it cannot resume."""
        return argv

    def stall_nudge(self) -> str | None:
        """A message that may wake the agent when it has gone silent (sent once, as the
        stall watchdog's first step; the agent is stopped only if it stays silent), or
        None: this agent cannot be nudged."""
        return None

    def encode_follow_up(self, text: str) -> str | None:
        """What to write to stdin to tell a working agent ``text`` unasked (ends with a
        newline), or None when this agent cannot take a follow-up."""
        return text if text.endswith("\n") else text + "\n"

    def initial_input(self, prompt: str) -> str | None:
        """Text to write to stdin right after the start (None: nothing)."""

    def feed_output(self, text: str) -> list[Signal]:
        """A chunk of output; chunks may split lines anywhere."""

    def feed_heartbeat(self, beat: Beat) -> list[Signal]:
        """One parsed heartbeat line."""

    def encode_answer(self, ask: Ask, response: str) -> str:
        """What to write to stdin to deliver ``response`` to ``ask`` (ends with a newline).

        Raises ``gridd.errors.ValidationFailed`` when ``response`` is not one of a closed
        set of options (a permission is ``allow`` or ``deny``; a pattern's prompt takes
        only its own choices)."""

    def feed_eof(self) -> list[Signal]:
        """The output ended: whatever an unterminated last line still means."""

    def auto_answer(self, ask: Ask) -> str | None:
        """The response the profile configured for ``ask`` (fed to ``encode_answer`` as a
        human's would be), or None: a human must answer."""
