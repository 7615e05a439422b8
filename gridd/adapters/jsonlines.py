"""What the adapters of CLIs that print one JSON event per line and read no input after
their start (Codex, Gemini CLI, opencode) share: line splitting, JSON parsing that is never
fatal (one ``Malformed`` per ``MALFORMED_EVERY`` bad lines; an unknown event type is logged
once at debug level and ignored, ``base.Unknown``),
the run ending with the turn (``ends_on_result``, ``idle``), and no stdin traffic.

A subclass names itself (``name``), lists its ``KNOWN`` event types, and implements
``event(obj)`` for each JSON object and ``plain(text)`` for each other line (stderr shares
the output).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from gridd.adapters.base import Activity, Adapter, Ask, Malformed, Signal, Unknown
from gridd.adapters.beat import Beat
from gridd.adapters.lines import LineSplitter, Overlong

MALFORMED_EVERY = 100
MAX_LINE = 16 * 1024 * 1024  # a command's whole output may come in one event


class JsonLinesAdapter(Adapter):
    """The frame of a JSON-lines CLI's adapter; ``event`` and ``plain`` read the lines."""

    name = "jsonlines"
    ends_on_result = True
    KNOWN: ClassVar[frozenset[str]] = frozenset()

    def __init__(self) -> None:
        self._lines = LineSplitter(max_line=MAX_LINE)
        self._turn_over = False  # the turn ended: the run may end
        self._unknown = Unknown(self.name)
        self._bad = 0

    def event(self, obj: dict[str, Any]) -> list[Signal]:
        """One JSON object the CLI printed."""
        return []

    def plain(self, text: str) -> list[Signal]:
        """One line that is not a JSON object (stripped, not empty)."""
        return []

    def initial_input(self, prompt: str) -> str | None:
        return None

    def encode_follow_up(self, text: str) -> str | None:
        return None  # the CLI reads no input once started

    def idle(self) -> bool:
        return self._turn_over

    def auto_answer(self, ask: Ask) -> str | None:
        return None

    def encode_answer(self, ask: Ask, response: str) -> str:
        return response if response.endswith("\n") else response + "\n"

    def feed_heartbeat(self, beat: Beat) -> list[Signal]:
        return [Activity(beat.label or beat.status, beat.message)]

    def feed_output(self, text: str) -> list[Signal]:
        return [signal for line in self._lines.feed(text) for signal in self._line(line)]

    def feed_eof(self) -> list[Signal]:
        return [signal for line in self._lines.flush() for signal in self._line(line)]

    def _line(self, line: str | Overlong) -> list[Signal]:
        if isinstance(line, Overlong):
            return self._malformed(f"a {line.length}-character line was skipped (too long)")
        text = line.strip()
        if not text:
            return []
        if not text.startswith("{"):
            return self.plain(text)
        try:
            obj = json.loads(text)
        except ValueError:
            return self._malformed(f"invalid or truncated JSON: {text[:80]!r}")
        if not isinstance(obj, dict):
            return self._malformed(f"not a JSON object: {text[:80]!r}")
        kind = obj.get("type")
        if isinstance(kind, str) and kind not in self.KNOWN:
            self._unknown.note(kind)
            return []
        return self.event(obj)

    def _malformed(self, message: str) -> list[Signal]:
        self._bad += 1
        if self._bad == 1 or self._bad % MALFORMED_EVERY == 0:
            return [Malformed(f"{self.name} output: {message} ({self._bad} unusable lines so far)")]
        return []


def as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def as_count(value: object) -> int:
    """A token count: a positive int, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
