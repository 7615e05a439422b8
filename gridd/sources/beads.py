"""The beads source: ready issues from ``bd ready --json --limit 0`` become gridd tasks.

A bead is claimed (``bd update <id> --claim``) before its agent is spawned; a failed claim
means someone else has it, so the task is dropped with no agent. Transitions are mirrored
back (``--status``, ``--add-label``, ``bd close``). ``bd`` failing or printing garbage is
an event and a retry with backoff, never a crash. Output is parsed leniently: fields drift
between bd versions, so only ``id`` is required.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gridd.background import Background
from gridd.events import EventBus
from gridd.ids import task_id_problem
from gridd.model import Task, TaskStatus, utcnow
from gridd.settings import BeadsSettings
from gridd.state import GridState
from gridd.workspace import Workspace

log = logging.getLogger(__name__)

SOURCE = "beads"
_TIMEOUT = 30.0


@dataclass(frozen=True)
class BdResult:
    code: int
    out: str
    err: str


class BdError(Exception):
    pass


def parse_ready(stdout: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Beads from ``bd ready --json`` output, and a warning per item that was skipped."""
    try:
        data = json.loads(stdout or "null")
    except json.JSONDecodeError as exc:
        raise BdError(f"bd ready printed something that is not JSON: {exc}") from None
    if data is None:
        return [], []
    if isinstance(data, dict) and isinstance(data.get("issues"), list):
        data = data["issues"]
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
        self._mirror: asyncio.Queue[list[str]] = asyncio.Queue()
        self._poke = asyncio.Event()

    def enabled(self) -> bool:
        if self.settings.enabled is not None:
            return self.settings.enabled
        return (self.ws.root / ".beads").is_dir() and shutil.which(
            self.settings.command[0]
        ) is not None

    def start(self) -> None:
        self.background.spawn("beads-poll", self._poll_loop())
        self.background.spawn("beads-mirror", self._mirror_loop())
        self.bus.add_listener(self._on_event)

    # -- running bd --------------------------------------------------------------------------------

    async def bd(self, *args: str) -> BdResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.settings.command,
                *args,
                cwd=str(self.ws.root),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise BdError(
                f"cannot run {self.settings.command[0]!r}: {exc.strerror or exc}"
            ) from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), _TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise BdError(f"bd {' '.join(args[:2])} timed out after {_TIMEOUT:.0f}s") from None
        return BdResult(
            proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
        )

    # -- polling -----------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while True:
            delay = self.settings.poll_seconds
            try:
                await self.sync()
                self.failures = 0
            except BdError as exc:
                self.failures += 1
                delay = min(60.0, self.settings.poll_seconds * 2**self.failures)
                log.warning("beads sync failed (%s); retrying in %.0fs", exc, delay)
                self.bus.publish("beads.error", {"error": str(exc), "retryInSeconds": delay})
            try:
                await asyncio.wait_for(self._poke.wait(), delay)
            except TimeoutError:
                pass
            self._poke.clear()

    async def sync(self) -> int:
        """One ``bd ready`` poll; returns how many tasks were added."""
        res = await self.bd("ready", "--json", "--limit", "0")
        if res.code != 0:
            raise BdError(f"bd ready exited {res.code}: {(res.err or res.out).strip()[:300]}")
        beads, warnings = parse_ready(res.out)
        for warning in warnings:
            self.bus.publish("beads.warning", {"warning": warning})
        new: list[Task] = []
        for bead in beads:
            bead_id = bead["id"]
            problem = task_id_problem(bead_id)
            if problem is not None:
                self.bus.publish(
                    "beads.warning", {"warning": f"bead id {bead_id[:80]!r} unusable: {problem}"}
                )
                continue
            if bead_id in self.state.tasks:
                continue
            new.append(
                Task(
                    id=bead_id,
                    status=TaskStatus.READY,
                    source=SOURCE,
                    agent=self.default_agent,
                    **bead_task_fields(bead),
                )
            )
        if new:
            self.state.add_tasks(new)
            self.state.flush()
        self.last_sync = time.monotonic()
        self.last_sync_at = utcnow()
        return len(new)

    def poke(self) -> None:
        self._poke.set()

    # -- claiming ----------------------------------------------------------------------------------

    async def claim(self, task: Task) -> bool:
        """Claim the bead before its agent starts; False when someone else holds it."""
        try:
            res = await self.bd("update", task.id, "--claim", "--json")
        except BdError as exc:
            self.bus.publish("beads.error", {"error": str(exc), "taskId": task.id})
            raise
        if res.code == 0:
            return True
        self.bus.publish(
            "beads.claim_lost",
            {
                "taskId": task.id,
                "exitCode": res.code,
                "message": (res.err or res.out).strip()[:300],
            },
        )
        return False

    # -- mirroring transitions back --------------------------------------------------------------------

    def _on_event(self, event: Any) -> None:
        if event.type != "tasks.changed":
            return
        for task in event.data.get("tasks", []):
            if task.get("source") != SOURCE:
                continue
            args = mirror_args(task["id"], task.get("status", ""))
            if args:
                self._mirror.put_nowait(args)
        if any(
            t.get("status") in ("review", "done", "failed") for t in event.data.get("tasks", [])
        ):
            self.poke()

    async def _mirror_loop(self) -> None:
        while True:
            args = await self._mirror.get()
            for attempt in range(5):
                try:
                    res = await self.bd(*args)
                    if res.code == 0:
                        break
                    error = f"bd {' '.join(args)} exited {res.code}: {res.err.strip()[:200]}"
                except BdError as exc:
                    error = str(exc)
                self.bus.publish("beads.error", {"error": error, "attempt": attempt + 1})
                await asyncio.sleep(min(30.0, 0.5 * 2**attempt))


def mirror_args(bead_id: str, status: str) -> list[str] | None:
    """The ``bd`` command that mirrors a gridd status onto the bead (None: nothing to do)."""
    if status == TaskStatus.REVIEW:
        return ["update", bead_id, "--status", "review"]
    if status == TaskStatus.DONE:
        return ["close", bead_id]
    if status in (TaskStatus.FAILED, TaskStatus.BLOCKED):
        return ["update", bead_id, "--add-label", "blocked"]
    if status == TaskStatus.READY:
        return None  # still ours to retry; bd keeps it in_progress while claimed
    return None
