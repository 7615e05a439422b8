"""The state database's health while the daemon runs: what its opening found (a quarantined
file, threats to the state files), the file unlinked or replaced under a running daemon
(written back), and a write a full or read-only disk refused: the pseudo-part ``store``,
degraded until a probe write commits again, with no request needed to notice.

Its warnings go into the daemon's list that ``/health`` reports (the ``Grid``'s)."""

from __future__ import annotations

import asyncio
import logging

from gridd.dbguard import Problem
from gridd.diskfault import DiskFault
from gridd.events import EventBus
from gridd.store import Store
from gridd.supervisor import Supervisor

log = logging.getLogger(__name__)

#: How often the database file is checked for having been unlinked or replaced.
STORE_CHECK_SECONDS = 1.0
#: The name /health and the daemon.degraded event give a state database that cannot write.
STORE_PART = "store"


class StoreHealth:
    def __init__(
        self,
        *,
        store: Store,
        bus: EventBus,
        supervisor: Supervisor,
        disk: DiskFault,
        warnings: list[str],
    ) -> None:
        self.store = store
        self.bus = bus
        self.supervisor = supervisor
        self.disk = disk
        #: The daemon's warnings (``/health``), which this appends to.
        self.warnings = warnings
        self._degraded = False

    def announce_opening(self) -> None:
        """Say what opening the database found: a file moved aside, threats to the files."""
        report = self.store.report
        if report.quarantined:
            moved = ", ".join(str(p) for p in report.quarantined)
            warning = f"state database was unreadable ({report.reason}); moved aside to {moved}"
            self.warnings.append(warning)
            self.bus.publish(
                "daemon.store_quarantined",
                {"reason": report.reason, "movedTo": [str(p) for p in report.quarantined]},
            )
        for problem in report.problems:
            self._problem(problem)

    def _problem(self, problem: Problem) -> None:
        """Announce a threat to the state files: log, /health warning, event."""
        log.error("state database: %s", problem.message)
        self.warnings.append(problem.message)
        self.bus.publish("daemon.store_problem", problem.wire())

    async def run(self) -> None:
        """The part ``store-watch``: the database file unlinked or replaced under a running
        daemon is written back; a disk that refused a write is probed until it takes writes
        again."""
        while True:
            await asyncio.sleep(STORE_CHECK_SECONDS)
            problem = self.store.check_file()
            if problem is not None:
                self._problem(problem)
            self.check_writes()
            if self.store.write_error is None:  # (else the store would mark it again)
                self.disk.recheck()

    def check_writes(self) -> None:
        """``store`` is degraded from a write refused by a full or read-only disk until a
        probe write commits again (so the daemon recovers with no request to prompt it)."""
        error = self.store.write_error
        if error is not None:
            self.disk.note(error)  # the same disk: starts pause until it takes writes
        if error is not None and not self._degraded:
            self._degraded = True
            log.error("state database cannot be written: %s", error.message)
            self.supervisor.announce_safely(
                "daemon.degraded",
                {"part": STORE_PART, "state": "down", "core": True, "error": error.message},
            )
        if self._degraded and self.store.probe_write():
            self._degraded = False
            log.warning("state database takes writes again")
            self.supervisor.retry_now()  # parts that crashed on the full disk need not wait
            self.supervisor.announce_safely("daemon.recovered", {"part": STORE_PART})
