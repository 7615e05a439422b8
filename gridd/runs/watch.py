"""Everything read from one agent run: output chunks, heartbeats, and what the adapter
makes of them, the refusals its sandbox's kernel made (``denied.ndjson``, written by the
shim: ``runs/refusals.py``); plus when the run last showed a sign of life.

Pure bookkeeping over the run directory's files (no events, no state): the pool polls it
and decides what to publish.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gridd.adapters import base
from gridd.adapters.beat import Beat, HeartbeatReader, LineReader
from gridd.runs.output import Chunk, OutputLog
from gridd.runs.refusals import DENIED_FILE

MAX_SUMMARY = 4000


@dataclass(frozen=True)
class Denial:
    """A refusal of the run's sandbox, as the shim recorded it: ``kind`` (``connect``,
    ``bind``, ``socket``), ``target``, and how many it held back before this one."""

    kind: str
    target: str
    unreported: int = 0


class DeniedReader(LineReader):
    """New refusals in ``denied.ndjson``, from a persisted byte offset (the shim writes at
    most a few lines a minute)."""

    def poll(self) -> list[Denial]:
        found = []
        for line in self.lines()[0]:
            try:
                doc = json.loads(line)
                found.append(Denial(str(doc["kind"]), str(doc["target"]), int(doc["unreported"])))
            except (ValueError, KeyError, TypeError):
                continue  # not the shim's (a torn write after a full disk): nothing to say
        return found


@dataclass
class Poll:
    chunks: list[Chunk] = field(default_factory=list)
    beats: list[Beat] = field(default_factory=list)
    signals: list[base.Signal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    denials: list[Denial] = field(default_factory=list)

    @property
    def life(self) -> bool:
        return bool(self.chunks or self.beats)


class RunWatch:
    def __init__(
        self,
        run_dir: Path,
        adapter: base.Adapter,
        *,
        heartbeat_offset: int = 0,
        denied_offset: int = 0,
    ) -> None:
        self.output = OutputLog(run_dir)
        self.heartbeats = HeartbeatReader(run_dir / "heartbeat.ndjson", heartbeat_offset)
        self.denied = DeniedReader(run_dir / DENIED_FILE, denied_offset)
        self.adapter = adapter
        self.last_life: float | None = None
        # What the run has told us so far (the outcome reads these at exit).
        self.continue_requested = False
        self.summary = ""
        self.rate_limited = False
        self.rate_limited_until: datetime | None = None
        self.result: base.Result | None = None
        self.cost: float | None = None
        self.session_id: str | None = None
        self.rate_limit: base.RateLimited | None = None
        self.launch_failed = False
        self.orphaned = False  # its shim died while the agent ran on
        #: gridd ended the conversation after a final result (closed its stdin): how the
        #: process then exits says nothing, the result does.
        self.session_ended = False
        self.rate_limit_published = False
        self.nudged = False  # a stall nudge was sent: the next stall step stops it
        #: Chunks indexed before a restart but never published: the next poll returns them.
        self.pending: list[Chunk] = []
        #: A look that could not be published (``hold``): the next poll returns it first.
        self.held: Poll | None = None
        #: Its exit was seen: the monitor reads what is left itself (the output pass skips it).
        self.finishing = False

    def replay(self, upto: int) -> None:
        """Feed the adapter the output already published before a daemon restart (chunks
        up to ``upto``), noting what it says but publishing nothing: the adapter's view of
        the conversation (a final result, the messages taken up) is then what it was."""
        since = 0
        while since < upto:
            chunks = self.output.read_since(since, limit=min(1000, upto - since))
            if not chunks:
                return
            for chunk in chunks:
                for signal in self.adapter.feed_output(chunk.text):
                    self._note(signal)
            since = chunks[-1].seq

    def unread(self) -> bool:
        """True when the run's files hold something ``poll`` has not taken yet (or it has
        ended)."""
        return self.unread_data() or os.path.exists(self.output.log_path.parent / "exit.json")

    def unread_data(self) -> bool:
        """True when output, heartbeats or refusals wait to be read (or a look's result
        waits to be published again): the safety-net sweep's question, three ``stat``
        calls."""
        if self.pending or self.held is not None or self.output.size() > self.output.offset:
            return True
        return (
            self.denied.size() > self.denied.offset
            or self.heartbeats.size() > self.heartbeats.offset
        )

    def hold(self, polled: Poll) -> None:
        """Keep a look whose publishing failed (a full disk): the next ``poll`` returns it
        first, so nothing read is lost or fed to the adapter twice."""
        self.held = polled

    def poll(self, *, final: bool = False, beats: bool = True) -> Poll:
        """What the run wrote since the last look. ``beats=False``: only ``output.log``
        was notified, the heartbeat and refusal files are not looked at this time."""
        held, self.held = self.held, None
        result = Poll()
        result.chunks = self.pending + self.output.poll(final=final)
        self.pending = []
        for chunk in result.chunks:
            result.signals += self.adapter.feed_output(chunk.text)
        new_beats, warnings = self.heartbeats.poll() if beats or final else ([], [])
        result.beats = new_beats
        result.warnings = warnings
        result.denials = self.denied.poll() if beats or final else []
        for beat in new_beats:
            if beat.message:
                self.summary = beat.message[-MAX_SUMMARY:]
            result.signals += self.adapter.feed_heartbeat(beat)
        if final:
            result.signals += self.adapter.feed_eof()
        if result.life:
            self.last_life = time.monotonic()
        for signal in result.signals:
            self._note(signal)
        if held is not None:
            result = Poll(
                chunks=held.chunks + result.chunks,
                beats=held.beats + result.beats,
                signals=held.signals + result.signals,
                warnings=held.warnings + result.warnings,
                denials=held.denials + result.denials,
            )
        return result

    def _note(self, signal: base.Signal) -> None:
        if isinstance(signal, base.Continue):
            self.continue_requested = True
            if signal.summary:
                self.summary = signal.summary[-MAX_SUMMARY:]
        elif isinstance(signal, base.RateLimited):
            self.rate_limited = True
            self.rate_limit = signal
            if signal.resets_at is not None:
                self.rate_limited_until = datetime.fromtimestamp(signal.resets_at, UTC)
        elif isinstance(signal, base.Retrying):
            # Waiting out the API's retry delay is life, not silence.
            self.last_life = time.monotonic() + signal.delay
        elif isinstance(signal, base.Result):
            self.result = signal
            if signal.text:
                self.summary = signal.text[-MAX_SUMMARY:]
        elif isinstance(signal, base.Cost):
            self.cost = signal.usd
        elif isinstance(signal, base.SessionId):
            self.session_id = signal.value
