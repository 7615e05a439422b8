"""Persistence: one SQLite database (WAL mode) owning the event log and domain state.

Only this package talks SQL. A database that cannot be read is never replaced silently:
it is moved aside to ``gridd.db.corrupt-<timestamp>`` and the move is reported to the
caller, who publishes it as an event and a health warning.

One module per concept, each class built on the one before (``Store`` is all of them):

- ``schema``: the migrations, the two connections, a corrupt file moved aside;
- ``writes``: how a write commits (the writer thread, transactions, after-commit
  callbacks, a disk that refuses writes) and the in-memory ``meta`` table (``Writes``);
- ``eventlog``: the event log (``EventLog``);
- ``tables``: tasks, agents and questions (``Tables``);
- ``database``: the file itself: open, identity, close, written back when it is
  unlinked or replaced under the daemon (``Store``).
"""

from __future__ import annotations

from gridd.errors import StoreError
from gridd.store.database import CLOSE_TIMEOUT_SECONDS, Store
from gridd.store.eventlog import POSITIONS_MARK, encode_payload
from gridd.store.schema import MIGRATIONS, SCHEMA_VERSION, OpenReport
from gridd.store.tables import LAST_LINE_CHARS, last_line, task_rows
from gridd.store.writes import DISK_CODES, PROBE_MARGIN_BYTES, SYNC_WAIT_SECONDS

__all__ = [
    "CLOSE_TIMEOUT_SECONDS",
    "DISK_CODES",
    "LAST_LINE_CHARS",
    "MIGRATIONS",
    "POSITIONS_MARK",
    "PROBE_MARGIN_BYTES",
    "SCHEMA_VERSION",
    "SYNC_WAIT_SECONDS",
    "OpenReport",
    "Store",
    "StoreError",
    "encode_payload",
    "last_line",
    "task_rows",
]
