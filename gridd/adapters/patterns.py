"""The patterns adapter: questions from interactive CLIs that offer nothing structured, read
off their output with a versioned pack of exact prompt patterns (``packs/``).

A question is recognised only when the text the CLI left waiting on its current line (no
newline yet: it is blocked reading stdin) is, as a whole, one of the pack's prompts. Text
that merely looks like a question (a line ending in "?", a prompt quoted mid-line, a prompt
already followed by more output) is never one. Each waiting line is asked about at most once.

Nothing is answered automatically unless the profile names that exact pattern id:
``{"pack": "aider", "auto_answer": {"aider.add_file": "yes"}}``; ``auto_answer(ask)`` then
gives the response, which goes through ``encode_answer`` like a human's. Heartbeats, when the
CLI writes them, are read as by the heartbeat adapter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gridd.adapters.base import Adapter, Ask, Signal
from gridd.adapters.beat import Beat
from gridd.adapters.heartbeat import QUESTION_TYPES, HeartbeatAdapter, one_line
from gridd.adapters.lines import LineSplitter
from gridd.adapters.packs import PACKS
from gridd.adapters.ratelimit import detect_rate_limit
from gridd.errors import ConfigError, ValidationFailed

MAX_PROMPT = 2048  # longer waiting lines are output, not prompts
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Choice:
    label: str
    send: str
    when: str | None = None  # offered only when this regex group matched


@dataclass(frozen=True)
class PromptPattern:
    id: str
    regex: re.Pattern[str]
    type: str
    subject: bool
    choices: tuple[Choice, ...]
    numbered: bool = False  # the choices are the prompt's own "[1] a [2] b" (its group)


@dataclass(frozen=True)
class Pack:
    name: str
    version: int
    patterns: tuple[PromptPattern, ...]


def clean(text: str) -> str:
    """What a terminal would show of ``text`` on its last redraw: no ANSI, no controls."""
    return _CONTROL.sub("", _ANSI.sub("", text.rsplit("\r", 1)[-1]))


def load_pack(name: str) -> Pack:
    data = PACKS.get(name)
    if data is None:
        raise ConfigError(
            f"unknown pattern pack {name!r}", details={"pack": name, "known": sorted(PACKS)}
        )
    try:
        patterns = tuple(_compile(item) for item in data["patterns"])
        return Pack(name=str(data["name"]), version=int(data["version"]), patterns=patterns)
    except (KeyError, TypeError, ValueError, re.error) as exc:
        raise ConfigError(f"pattern pack {name!r} is invalid: {exc}") from exc


_NUMBERED = re.compile(r"\[(?P<n>[1-9])\] (?P<label>[^\[\]]*?[^\[\]\s])(?= \[[1-9]\] |$)")


def _compile(item: dict[str, Any]) -> PromptPattern:
    regex = re.compile(item["regex"])
    if item["options"] == "numbered":
        if "choices" not in regex.groupindex or item["type"] not in QUESTION_TYPES:
            raise ValueError(f"{item['id']}: numbered options need a 'choices' group")
        return PromptPattern(
            str(item["id"]), regex, item["type"], bool(item["subject"]), (), numbered=True
        )
    choices = tuple(Choice(str(o["label"]), str(o["send"]), o.get("when")) for o in item["options"])
    for choice in choices:
        if choice.when is not None and choice.when not in regex.groupindex:
            raise ValueError(f"{item['id']}: option {choice.label!r} names no group")
    if item["type"] not in QUESTION_TYPES or not choices:
        raise ValueError(f"{item['id']}: bad type or no options")
    return PromptPattern(str(item["id"]), regex, item["type"], bool(item["subject"]), choices)


class PatternsAdapter(Adapter):
    """Questions from a CLI's waiting prompt line, matched against one pattern pack."""

    name = "patterns"

    def __init__(
        self,
        *,
        pack: str,
        auto_answer: dict[str, str] | None = None,
        send_prompt: bool = False,
    ) -> None:
        self.pack = load_pack(pack)
        self._by_id = {pattern.id: pattern for pattern in self.pack.patterns}
        self._auto = dict(auto_answer or {})
        for pattern_id, response in self._auto.items():
            pattern = self._by_id.get(pattern_id)
            if pattern is None or _resolve(pattern.choices, response) is None:
                raise ConfigError(
                    f"auto_answer names {pattern_id!r}: {response!r}, which pack "
                    f"{pack!r} v{self.pack.version} does not offer",
                    details={"pattern": pattern_id, "known": sorted(self._by_id)},
                )
        self._send_prompt = send_prompt
        self._lines = LineSplitter(max_line=64 * 1024)
        self._previous = ""  # the last complete line: aider prints a prompt's subject there
        self._asked_line = -1  # stream offset of the waiting line already asked about
        self._counter = 0
        self._numbered: dict[str, tuple[Choice, ...]] = {}  # ask key -> its own choices
        self._beats = HeartbeatAdapter(name="patterns")

    def initial_input(self, prompt: str) -> str | None:
        return one_line(prompt) + "\n" if self._send_prompt else None

    def feed_output(self, text: str) -> list[Signal]:
        signals = self._complete(self._lines.feed(text))
        size = self._lines.partial_size
        if 0 < size <= MAX_PROMPT:
            line_start = self._lines.offset - size
            if line_start != self._asked_line:
                ask = self._match(clean(self._lines.partial))
                if ask is not None:
                    self._asked_line = line_start
                    signals.append(ask)
        return signals

    def feed_eof(self) -> list[Signal]:
        return self._complete(self._lines.flush())

    def feed_heartbeat(self, beat: Beat) -> list[Signal]:
        return self._beats.feed_heartbeat(beat)

    def encode_answer(self, ask: Ask, response: str) -> str:
        pattern = self._by_id.get(str(ask.meta.get("pattern")))
        if pattern is None:
            return self._beats.encode_answer(ask, response)
        offered = self._numbered.get(ask.key) or tuple(
            c for c in pattern.choices if c.label in ask.options
        )
        choice = _resolve(tuple(offered), response)
        if choice is None:
            raise ValidationFailed(
                f"{response[:80]!r} is not one of {ask.options}",
                details={"options": ask.options, "response": response[:200]},
            )
        return choice.send

    def auto_answer(self, ask: Ask) -> str | None:
        response = self._auto.get(str(ask.meta.get("pattern")))
        pattern = self._by_id.get(str(ask.meta.get("pattern")))
        if response is None or pattern is None:
            return None
        choice = _resolve(tuple(c for c in pattern.choices if c.label in ask.options), response)
        return choice.label if choice is not None else None

    def _complete(self, lines: list[Any]) -> list[Signal]:
        signals: list[Signal] = []
        for line in lines:
            if isinstance(line, str):
                self._previous = clean(line).strip()
                limited = detect_rate_limit(self._previous)
                if limited is not None:
                    signals.append(limited)
            else:
                self._previous = ""
        return signals

    def _match(self, prompt: str) -> Ask | None:
        for pattern in self.pack.patterns:
            match = pattern.regex.fullmatch(prompt)
            if match is None:
                continue
            groups = pattern.regex.groupindex
            asked = match["question"] if "question" in groups else prompt
            question = (asked or "").strip()
            subject = self._previous if pattern.subject else ""
            if subject:
                question = f"{question} ({subject})"
            if pattern.numbered:
                choices = _numbered(match["choices"])
                if choices is None:
                    continue
            else:
                choices = [
                    c for c in pattern.choices if c.when is None or match[c.when] is not None
                ]
            question = question or "Choose one"
            self._counter += 1
            meta = {
                "pattern": pattern.id,
                "pack": self.pack.name,
                "pack_version": self.pack.version,
                "prompt": prompt.rstrip(),
                "subject": subject or None,
                # The keys the CLI reads name their options too: "y" answers "yes".
                "aliases": {c.send.strip(): c.label for c in choices if c.send.strip()},
            }
            labels = [c.label for c in choices]
            if pattern.numbered:
                self._numbered[f"p{self._counter}"] = tuple(choices)
            return Ask(f"p{self._counter}", pattern.type, question, labels, meta)
        return None


def _numbered(text: str) -> list[Choice] | None:
    """``[1] red [2] blue``'s choices (answered "1", "2"), or None unless they are numbered
    from 1 in order with distinct words."""
    found = [(int(m["n"]), m["label"].strip()) for m in _NUMBERED.finditer(text)]
    labels = [label for _, label in found]
    if [n for n, _ in found] != list(range(1, len(found) + 1)) or len(set(labels)) != len(labels):
        return None
    return [Choice(label, f"{n}\n") for n, label in found]


def _resolve(choices: tuple[Choice, ...], response: str) -> Choice | None:
    """The choice ``response`` names: its label, or the text it sends ("y"), any case."""
    word = response.strip().lower()
    for choice in choices:
        if word and word in (choice.label.lower(), choice.send.strip().lower()):
            return choice
    return None
