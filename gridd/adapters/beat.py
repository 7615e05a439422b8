"""The heartbeat contract (wakecycle's worker contract): an agent appends one JSON object
per line to ``$GRID_HEARTBEAT``. Only ``status`` is interpreted; ``label``, ``message`` and
``data`` are shown. A malformed line is skipped with a warning, never fatal.

Statuses gridd understands: ``started``, ``working`` (or anything unknown: just life),
``continue`` (ask for another session), ``question`` (ask a human), ``done``, ``failed``.
An optional ``cost_usd`` number reports spend so far in this session.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_LINE = 1024 * 1024


@dataclass(frozen=True)
class Beat:
    status: str
    label: str | None = None
    message: str | None = None
    data: Any = None
    cost_usd: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)


def parse_beat(line: str) -> Beat | str:
    """A Beat, or a warning saying why the line was skipped."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"heartbeat line is not JSON ({exc.msg}): {line[:80]!r}"
    if not isinstance(obj, dict):
        return f"heartbeat line is not a JSON object: {line[:80]!r}"
    status = obj.get("status")
    if not isinstance(status, str) or not status:
        return f"heartbeat line has no string 'status': {line[:80]!r}"
    cost = obj.get("cost_usd", obj.get("costUsd"))
    return Beat(
        status=status[:64],
        label=str(obj["label"])[:200] if obj.get("label") is not None else None,
        message=str(obj["message"])[:4000] if obj.get("message") is not None else None,
        data=obj.get("data"),
        cost_usd=float(cost) if isinstance(cost, int | float) and cost >= 0 else None,
        raw=obj,
    )


class LineReader:
    """New complete lines of a file that an agent's run appends to (its heartbeats, the
    shim's record of refusals: ``runs/watch.py``), from a persisted byte offset."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self._path = str(path)  # stat'ed once per look at the run: no Path work there
        self.offset = offset

    def size(self) -> int:
        try:
            return os.stat(self._path).st_size
        except FileNotFoundError:
            return 0

    def lines(self) -> tuple[list[bytes], bool]:
        """The complete lines written since the last call (a line still being written
        waits), and whether a runaway line (``MAX_LINE`` bytes without a newline) was
        skipped meanwhile."""
        size = self.size()
        if size < self.offset:
            self.offset = 0  # truncated and rewritten: start over
        if size == self.offset:
            return [], False
        with open(self._path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(size - self.offset)
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) > MAX_LINE:  # a runaway line with no newline: skip it
                self.offset = size
                return [], True
            return [], False  # wait for the rest of the line
        self.offset += end + 1
        return data[:end].split(b"\n"), False


class HeartbeatReader(LineReader):
    """Reads new heartbeats from a heartbeat file, from a persisted byte offset."""

    def poll(self) -> tuple[list[Beat], list[str]]:
        found, skipped = self.lines()
        if skipped:
            return [], [f"heartbeat line longer than {MAX_LINE} bytes skipped"]
        beats: list[Beat] = []
        warnings: list[str] = []
        for raw in found:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            parsed = parse_beat(line)
            if isinstance(parsed, Beat):
                beats.append(parsed)
            else:
                warnings.append(parsed)
        return beats, warnings
