"""The durable event log: events appended with ids that only ever go up (handed out
here, never by SQLite alone), read back after an id, and pruned to the newest."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from gridd.model import Event, isotime, utcnow
from gridd.store.writes import Writes

#: meta key: the event id up to which agents' rows hold their output positions; the
#: ``agent.output`` events after it say the rest (``load_agents``).
POSITIONS_MARK = "output.positions_through"

_INSERT_EVENT = "INSERT INTO events(id, type, data, ts) VALUES (?, ?, ?, ?)"


class EventLog(Writes):
    """The ``events`` table (``Writes`` says how a write commits)."""

    #: The id the next event appended gets (``Store.__init__`` says why it is ours).
    _next_event_id: int

    def append_event(self, type_: str, data: dict[str, Any], ts: datetime | None = None) -> Event:
        ts = ts or utcnow()
        payload = encode_payload(data)
        event_id = self._next_event_id
        row = (event_id, type_, payload, isotime(ts))
        # Spent even if the insert is rolled back later: ids only ever go up.
        self._next_event_id = event_id + 1
        self._write(lambda c: c.execute(_INSERT_EVENT, row))
        event = Event(id=event_id, type=type_, data=data, ts=ts)
        event._json = payload
        event._nbytes = len(payload)
        return event

    def append_events(
        self, type_: str, datas: list[dict[str, Any]], *, payloads: list[str] | None = None
    ) -> list[Event]:
        """Many events of one type, one timestamp, one statement (``executemany``): the
        output pass's chunks. Call inside a transaction. ``payloads``: the datas already
        encoded (``encode_payload``, e.g. on a worker thread)."""
        ts = utcnow()
        stamp = isotime(ts)
        first = self._next_event_id
        events, rows = [], []
        for n, data in enumerate(datas):
            payload = payloads[n] if payloads is not None else encode_payload(data)
            rows.append((first + n, type_, payload, stamp))
            event = Event(id=first + n, type=type_, data=data, ts=ts)
            event._json = payload
            event._nbytes = len(payload)
            events.append(event)
        self._next_event_id = first + len(rows)  # spent even if rolled back, as above
        self._write(lambda c: c.executemany(_INSERT_EVENT, rows))
        return events

    @property
    def last_appended_id(self) -> int:
        """The id of the last event appended (committed, queued or in a transaction)."""
        return self._next_event_id - 1

    def events_after(
        self, since: int, *, types: Iterable[str] | None = None, limit: int = 500
    ) -> list[Event]:
        type_list = sorted(set(types)) if types else None
        if type_list:
            marks = ",".join("?" * len(type_list))
            rows = self._exec(
                f"SELECT id, type, data, ts FROM events WHERE id > ? AND type IN ({marks})"
                " ORDER BY id LIMIT ?",
                (since, *type_list, limit),
            ).fetchall()
        else:
            rows = self._exec(
                "SELECT id, type, data, ts FROM events WHERE id > ? ORDER BY id LIMIT ?",
                (since, limit),
            ).fetchall()
        events = []
        for r in rows:
            event = Event(
                id=r[0], type=r[1], data=json.loads(r[2]), ts=datetime.fromisoformat(r[3])
            )
            event._json = r[2]
            event._nbytes = len(r[2])
            events.append(event)
        return events

    def last_event_id(self) -> int:
        """The id of the last event committed."""
        row = self._exec("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        return int(row[0]) if row else 0

    def _max_event_id(self) -> int:
        row = self._exec("SELECT MAX(id) FROM events").fetchone()
        top = int(row[0]) if row and row[0] is not None else 0
        return max(top, self.last_event_id())

    def first_event_id(self) -> int:
        """The oldest id still retained (``last + 1`` when the log is empty)."""
        row = self._exec("SELECT MIN(id) FROM events").fetchone()
        return int(row[0]) if row and row[0] is not None else self.last_event_id() + 1

    def prune_events(self, retain: int) -> int:
        """Drop all but the newest ``retain`` events; returns how many were removed (0 when
        the delete is still queued behind slow writes)."""
        cutoff = self.last_event_id() - retain
        mark = self.positions_mark()
        if mark is not None:
            cutoff = min(cutoff, mark)  # output positions after the mark live in the log
        if cutoff <= 0:
            return 0
        removed = self._write(
            lambda c: c.execute("DELETE FROM events WHERE id <= ?", (cutoff,)).rowcount
        )
        return int(removed or 0)

    def positions_mark(self) -> int | None:
        """The id up to which agents' rows hold their output positions (None: all of it,
        as a database from before positions were saved lazily)."""
        raw = self.get_meta(POSITIONS_MARK)
        return int(raw) if raw is not None else None


def encode_payload(data: dict[str, Any]) -> str:
    """An event's data as the log stores it (and streams send it)."""
    return json.dumps(data, separators=(",", ":"), default=str, allow_nan=False)
