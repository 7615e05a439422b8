"""The beads source: ready issues from ``bd ready --json --limit 0`` become gridd tasks.

A bead is claimed (``bd update <id> --claim``) ahead of its start or as its agent starts
(``beads_claim``); a claim lost means someone else has it: the task is cancelled, and an
agent already started for it is stopped with nothing committed. Status changes are mirrored
back through ``beads_mirror`` (only statuses stock bd accepts). New beads are seen at once:
a watch on ``.beads/`` runs ``bd ready`` when bd's data changes, with a slow poll as the
safety net (a change that is only the echo of gridd's own write is read at most once per
``SYNC_GAP_SECONDS``). ``bd`` failing or printing garbage is an event and a retry with
backoff, never a crash. Output is parsed leniently: fields drift between bd versions, so
only ``id`` is required.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gridd.background import Background
from gridd.errors import GriddError
from gridd.events import EventBus
from gridd.model import Task, TaskStatus, utcnow
from gridd.settings import BeadsSettings
from gridd.sources.bd import BdError, BdResult, run_bd
from gridd.sources.beads_claim import BeadClaims
from gridd.sources.beads_mirror import BeadWriter, mirror_writes
from gridd.sources.beads_watch import is_own_echo, watch_beads
from gridd.state import GridState
from gridd.workspace import Workspace

log = logging.getLogger(__name__)

SOURCE = "beads"
#: The shortest pause between two ``bd ready`` runs woken by gridd's own writes.
SYNC_GAP_SECONDS = 0.2
#: A change seen while one of gridd's own bd writes runs, or this soon after one ended, is
#: taken for that write's echo (``beads_watch.is_own_echo``).
OWN_ECHO_SECONDS = 0.1
#: A change that is not an echo skips the pause between reads at most this often.
HURRY_SECONDS = 1.0
#: Refused beads remembered (so each is reported once) before the memory starts over.
REFUSED_LIMIT = 10_000
__all__ = ["SOURCE", "BdError", "BdResult", "BeadsSource", "bead_task_fields", "parse_ready"]


def parse_ready(stdout: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Beads from ``bd ready --json`` output, and a warning per item that was skipped."""
    try:
        data = json.loads(stdout or "null")
    except json.JSONDecodeError as exc:
        raise BdError(f"bd ready printed something that is not JSON: {exc}") from None
    if data is None:
        return [], []
    if isinstance(data, dict):  # BD_JSON_ENVELOPE=1 wraps in "data"; old versions used "issues"
        data = next((data[k] for k in ("data", "issues") if isinstance(data.get(k), list)), data)
    if not isinstance(data, list):
        raise BdError(f"bd ready printed JSON that is not a list ({type(data).__name__})")
    beads, warnings = [], []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            warnings.append(f"skipped an entry without a string id: {str(item)[:80]}")
            continue
        beads.append(item)
    return beads, warnings


def bead_task_fields(bead: dict[str, Any]) -> dict[str, Any]:
    raw_title = bead.get("title")
    title = raw_title if isinstance(raw_title, str) else ""
    parts = [title]
    for key in ("description", "design", "acceptance_criteria", "notes"):
        value = bead.get(key)
        if isinstance(value, str) and value.strip():
            parts.append(f"{key.replace('_', ' ').title()}:\n{value.strip()}")
    priority = bead.get("priority")
    labels = bead.get("labels")
    return {
        "title": (title or bead["id"])[:500],
        "prompt": "\n\n".join(parts),
        "priority": priority if isinstance(priority, int) and 0 <= priority <= 4 else 2,
        "labels": [x for x in labels if isinstance(x, str)] if isinstance(labels, list) else [],
    }


class BeadsSource:
    def __init__(
        self,
        *,
        workspace: Workspace,
        settings: BeadsSettings,
        state: GridState,
        bus: EventBus,
        background: Background,
        default_agent: str | None,
    ) -> None:
        self.ws = workspace
        self.settings = settings
        self.state = state
        self.bus = bus
        self.background = background
        self.default_agent = default_agent
        self.last_sync: float | None = None
        self.last_sync_at: datetime | None = None
        self.failures = 0
        #: Set once the first ``bd ready`` has answered (or failed): the daemon serves after it.
        self.first_sync = asyncio.Event()
        #: Why the last ``bd ready`` failed; None once one succeeds (``/health`` degraded).
        self.error: str | None = None
        self._asking: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()
        #: Set by a change that is not gridd's own write: read at once, with no gap.
        self._urgent = asyncio.Event()
        self._writing = 0
        self._wrote_at: float | None = None
        self._hurried_at: float | None = None
        self.writer = BeadWriter(
            run=lambda args: self.bd(*args), bus=bus, background=background, settings=settings
        )
        self.claims = BeadClaims(
            source=SOURCE,
            run=lambda args: self.bd(*args),
            writer=self.writer,
            state=state,
            bus=bus,
            background=background,
            ahead=settings.claim_ahead,
        )
        #: The status last mirrored onto each bead (so a status is written once).
        self._shown: dict[str, str] = {}
        #: Bead id -> why it was refused (reported once until the reason changes).
        self._refused: dict[str, str] = {}
        #: Creates a task from a bead's fields through the same commands as ``POST /tasks``
        #: (``Commands.create_from_source``; handed over by ``start``).
        self.create: Callable[[dict[str, Any]], Task] = self._unwired
        #: Started: beads feed tasks (whether enabled is known only at the daemon's start).
        self.running = False

    @staticmethod
    def _unwired(fields: dict[str, Any]) -> Task:
        raise GriddError("the beads source is not wired to the commands", code="not_wired")

    def enabled(self) -> bool:
        if self.settings.enabled is not None:
            return self.settings.enabled
        return (self.ws.root / ".beads").is_dir() and shutil.which(
            self.settings.command[0]
        ) is not None

    def start(self, create: Callable[[dict[str, Any]], Task]) -> None:
        """Feed beads into ``create`` from now on."""
        self.create = create
        self.running = True
        self.background.supervise("beads-sync", self._sync_loop)
        if self.settings.watch:
            self.background.supervise(
                "beads-watch",
                lambda: watch_beads(self.ws.root / ".beads", self.changed, bus=self.bus),
            )
        self.bus.add_listener(self._on_event)
        self.claims.start()

    async def bd(self, *args: str) -> BdResult:
        write = args[:1] != ("ready",)
        self._writing += write
        try:
            return await run_bd(self.settings.command, args, cwd=self.ws.root)
        finally:
            if write:
                self._writing -= 1
                self._wrote_at = time.monotonic()

    # -- seeing ready beads ------------------------------------------------------------------

    async def _sync_loop(self) -> None:
        """Run ``bd ready`` when poked (the watch, a finished task) or every ``poll_seconds``."""
        while True:
            self._poke.clear()
            self._urgent.clear()
            poll = self.settings.poll_seconds or None  # 0: no poll, only the watch
            delay = poll
            added = 0
            try:
                added = await self.sync()
                self.failures = 0
            except BdError as exc:
                self.failures += 1
                delay = min(60.0, max(1.0, poll or 1.0) * 2**self.failures)
                log.warning("beads sync failed (%s); retrying in %.0fs", exc, delay)
                self.bus.publish("beads.error", {"error": str(exc), "retryInSeconds": delay})
            finally:
                self.first_sync.set()  # landed or failed: the daemon need not wait longer
            try:
                await asyncio.wait_for(self._poke.wait(), delay)
            except TimeoutError:
                pass
            await self._pause(found=added > 0)

    async def _pause(self, *, found: bool) -> None:
        """The pause before the next read. The echoes of gridd's own claims and writes
        (which make nothing new ready, but come in bursts) are read once per
        SYNC_GAP_SECONDS at most. Any other change (a new bead, most likely) is read at once,
        even during such a pause, but at most once per HURRY_SECONDS: a bd whose reads touch
        its own files must not make gridd read in a loop. A change seen while a read that
        found new beads ran was most likely those beads: it waits, not to compete with
        their agents' starts."""
        if found:
            self._urgent.clear()
        now = time.monotonic()
        wait = SYNC_GAP_SECONDS - (now - (self.last_sync or 0.0))
        if wait <= 0:
            return
        if self._hurried_at is not None and now - self._hurried_at < HURRY_SECONDS:
            await asyncio.sleep(wait)
            return
        try:
            await asyncio.wait_for(self._urgent.wait(), wait)
        except TimeoutError:
            return
        self._hurried_at = time.monotonic()

    async def sync(self) -> int:
        """One ``bd ready`` poll; returns how many tasks were added."""
        try:
            res = await self.bd("ready", "--json", "--limit", "0")
            if res.code != 0:
                raise BdError(f"bd ready exited {res.code}: {res.message[:300]}")
            beads, warnings = parse_ready(res.out)
        except BdError as exc:
            self.error = str(exc)
            raise
        self.error = None
        for warning in warnings:
            self.bus.publish("beads.warning", {"warning": warning})
        added = 0
        for bead in beads:
            bead_id = bead["id"]
            if bead_id in self.state.tasks:
                continue
            fields = {"id": bead_id, "agent": self.default_agent, **bead_task_fields(bead)}
            try:
                self.create(fields)
            except GriddError as exc:
                self._refuse(bead_id, exc)
                continue
            self._refused.pop(bead_id, None)
            added += 1
        self.last_sync = time.monotonic()
        self.last_sync_at = utcnow()
        return added

    def _refuse(self, bead_id: str, exc: GriddError) -> None:
        """A bead gridd will not take as it is: said once (until what is wrong changes)."""
        if self._refused.get(bead_id) == exc.message:
            return
        if len(self._refused) > REFUSED_LIMIT:
            self._refused.clear()
        self._refused[bead_id] = exc.message
        self.bus.publish(
            "beads.error",
            {
                "beadId": bead_id[:200],
                "error": exc.message,
                "code": exc.code,
                "details": exc.details,
                "permanent": True,
                "retryInSeconds": None,
            },
        )

    def poke(self) -> None:
        self._poke.set()

    def problem(self) -> str | None:
        """What ``/health`` says of this source: its first read not landed, or its last
        read failed; None while it is in step with bd."""
        if not self.first_sync.is_set():
            return "beads: the first 'bd ready' has not answered yet"
        if self.error is not None:
            return f"beads: {self.error}"
        return None

    async def ask(self, task_id: str) -> bool:
        """Ask bd once more, now, for an id gridd does not know (``POST /tasks/{id}/start``
        may name a bead made since the last read). Asks made at the same moment share one
        ``bd ready``. True when the task is known afterwards; a failing bd is reported by
        the sync loop, not here. False while the source is not running."""
        if not self.running:
            return False
        if self._asking is None or self._asking.done():
            self._asking = self.background.spawn("beads-ask", self._ask_bd())
        await asyncio.shield(self._asking)  # a client that goes away does not cancel it
        return task_id in self.state.tasks

    async def _ask_bd(self) -> None:
        try:
            await self.sync()
        except BdError as exc:
            log.info("asking bd for an unknown task: %s", exc)

    def changed(self) -> None:
        """The watch saw bd's data change."""
        now = time.monotonic()
        if not is_own_echo(
            now, writing=self._writing, wrote_at=self._wrote_at, window=OWN_ECHO_SECONDS
        ):
            self._urgent.set()
        self._poke.set()

    # -- claiming ----------------------------------------------------------------------------

    async def claim(self, task: Task) -> bool:
        """Claim the bead before its agent starts (or while it starts: see ``pool.spawning``);
        False when someone else holds it. Made ahead already, it costs no bd call."""
        won = await self.claims.claim(task)
        if won:
            self._shown[task.id] = TaskStatus.WORKING
        return won

    # -- mirroring transitions back ----------------------------------------------------------

    def _on_event(self, event: Any) -> None:
        if event.type == "session.stopped":
            self.claims.session_stopped()
            return
        if event.type != "tasks.changed":
            return
        finished = False
        for task in event.data.get("tasks", []):
            if task.get("source") != SOURCE:
                continue
            bead_id, status = task["id"], str(task.get("status", ""))
            previous = self._shown.get(bead_id)
            if status == previous:
                continue
            self._shown[bead_id] = status
            writes = mirror_writes(
                bead_id,
                status,
                previous=previous,
                settings=self.settings,
                merge_commit=task.get("mergeCommit"),
                error=task.get("error"),
                claimed=bead_id in self.claims.held,
            )
            if status in (TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED):
                self.claims.held.discard(bead_id)
            elif status == TaskStatus.WORKING and previous in (
                TaskStatus.FAILED,
                TaskStatus.CANCELLED,
            ):
                self.claims.held.add(bead_id)
            self.writer.submit(bead_id, writes)
            finished = finished or status in ("review", "done", "failed")
        if finished and not self.settings.watch:
            self.poke()  # a closed bead may unblock others (with the watch on, bd's write shows)
