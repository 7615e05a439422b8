"""The heartbeat adapter: the default for any command (also registered as ``plain``).

Structured signals come only from the heartbeat file (REFERENCE.md §4, parsed by
``gridd.adapters.beat``); the agent's stdout and stderr are shown but never interpreted,
except for a whole line that is exactly a known usage-limit notice (``ratelimit.py``).

Heartbeat ``status`` values and what they become:

    any status          Activity(label or status, message), plus Cost when ``cost_usd`` is set
    question            Ask: ``question`` (or ``message``), ``options``, ``type`` (default
                        clarification), key = the beat's ``id`` or q1, q2, ...
    continue            Continue(summary=message)
    rate_limited        RateLimited(message, resets_at from ``resets_at``: epoch or ISO 8601)

A worker that keeps beating the same question while it waits asks once: a question whose
``id`` was already asked (waiting or answered) is not asked again; without an ``id``, one
whose text and options match a question still waiting is not. The answer goes to stdin as
one line.
"""

from __future__ import annotations

from typing import Any

from gridd.adapters.base import (
    Activity,
    Adapter,
    Ask,
    Continue,
    Cost,
    Malformed,
    RateLimited,
    Signal,
)
from gridd.adapters.beat import Beat
from gridd.adapters.lines import LineSplitter
from gridd.adapters.ratelimit import LIMIT_WORD, detect_rate_limit, parse_timestamp

QUESTION_TYPES = frozenset(
    {"permission", "decision", "clarification", "human-verify", "human-action"}
)
MAX_OPTIONS = 32
MAX_TEXT = 4000


class HeartbeatAdapter(Adapter):
    """Signals from heartbeat beats; plain output is only a sign of life."""

    name = "heartbeat"

    def __init__(self, *, name: str = "heartbeat") -> None:
        self.name = name
        self._lines = LineSplitter(max_line=4096)
        self._counter = 0
        self._waiting: dict[str, tuple[str, tuple[str, ...]]] = {}  # key -> (question, options)
        self._used: set[str] = set()  # every key handed out: a repeated id is a stale repeat
        self._tail = ""  # the end of the previous chunk: a word may span two chunks

    def initial_input(self, prompt: str) -> str | None:
        return None  # the prompt reaches a generic command through its argv ({prompt})

    def feed_output(self, text: str) -> list[Signal]:
        # Plain output matters only for usage-limit notices, and every one says "limit":
        # a chunk that cannot complete such a line is not split into lines at all (this
        # was most of the daemon's work for an agent printing a lot).
        window = self._tail + text
        self._tail = text[-len(LIMIT_WORD) :]
        partial = self._lines.partial if self._lines.partial_size < 4096 else LIMIT_WORD
        if LIMIT_WORD not in window and LIMIT_WORD not in partial:
            self._lines.skip(text)
            return []
        return self._scan(self._lines.feed(text))

    def feed_eof(self) -> list[Signal]:
        return self._scan(self._lines.flush())

    def feed_heartbeat(self, beat: Beat) -> list[Signal]:
        signals: list[Signal] = [Activity(beat.label or beat.status, beat.message)]
        if beat.cost_usd is not None:
            signals.append(Cost(beat.cost_usd))
        if beat.status == "question":
            signals.extend(self._question(beat.raw, beat.message))
        elif beat.status == "continue":
            signals.append(Continue(summary=beat.message or ""))
        elif beat.status == "rate_limited":
            message = beat.message or "usage limit reached"
            signals.append(
                RateLimited(message, parse_timestamp(beat.raw.get("resets_at")), source="heartbeat")
            )
        return signals

    def encode_answer(self, ask: Ask, response: str) -> str:
        self._waiting.pop(ask.key, None)
        return one_line(response) + "\n"

    def auto_answer(self, ask: Ask) -> str | None:
        return None

    def _question(self, raw: dict[str, Any], message: str | None) -> list[Signal]:
        question = raw.get("question", message)
        if not isinstance(question, str) or not question.strip():
            return [Malformed("question heartbeat without a 'question' text")]
        question = question.strip()[:MAX_TEXT]
        options = _options(raw.get("options"))
        kind = raw.get("type")
        kind = kind if isinstance(kind, str) and kind in QUESTION_TYPES else "clarification"
        beat_id = raw.get("id")
        if isinstance(beat_id, str | int) and not isinstance(beat_id, bool) and str(beat_id):
            key = str(beat_id)[:128]
            if key in self._used:
                return []  # the same question, beaten again while it waits or after
        else:
            if (question, options) in self._waiting.values():
                return []
            key = ""
            while not key or key in self._used:
                self._counter += 1
                key = f"q{self._counter}"
        self._used.add(key)
        self._waiting[key] = (question, options)
        return [Ask(key=key, type=kind, question=question, options=list(options))]

    def _scan(self, lines: list[Any]) -> list[Signal]:
        signals: list[Signal] = []
        for line in lines:
            if isinstance(line, str):
                limited = detect_rate_limit(line)
                if limited is not None:
                    signals.append(limited)
        return signals


def one_line(text: str) -> str:
    """``text`` with every line break replaced by a space (an answer is one stdin line)."""
    return " ".join(text.splitlines()) if text else ""


def _options(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    out: list[str] = []
    for item in value[:MAX_OPTIONS]:
        if isinstance(item, str | int | float) and not isinstance(item, bool):
            text = str(item).strip()
        elif isinstance(item, dict) and isinstance(item.get("label"), str):
            text = item["label"].strip()
        else:
            continue
        if text and text not in out:
            out.append(text[:200])
    return tuple(out)
