"""Notifications: a few chosen events become a short message for a human.

Channels: a webhook (JSON POST, retried), the desktop (``notify-send`` / ``osascript``) and a
command hook (argv, JSON on stdin). The bus listener only decides and enqueues into a bounded
queue (the oldest entry is dropped when it is full), so a stuck channel never slows whoever
publishes; one worker delivers. Identical notifications within ``coalesce_seconds`` are sent
once, then once more as a summary with their count when the window closes. A failed delivery
becomes a ``notify.failed`` event; nothing here raises into the bus or ends the worker.

Besides event types, two derived kinds exist: ``task.failed`` (a task in ``tasks.changed``
became failed) and ``tasks.all_done`` (every task is done or cancelled, at least one).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

from gridd.background import Background
from gridd.event_types import DERIVED_NOTIFICATIONS
from gridd.events import EventBus
from gridd.model import Event
from gridd.settings import NotificationSettings

log = logging.getLogger(__name__)

_FINISHED = frozenset({"done", "cancelled"})


@dataclass(frozen=True)
class Notification:
    kind: str  # an event type, or a derived kind (task.failed, tasks.all_done)
    title: str
    body: str
    event: Event
    count: int = 1  # > 1: a summary of this many identical notifications

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.title, self.body)


class _Failed(Exception):
    """A channel could not deliver; the message becomes ``notify.failed``'s ``error``."""


def _short(text: Any, limit: int = 200) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


class NotificationRules:
    """Decides which notifications an event makes; remembers task statuses to derive kinds."""

    def __init__(self, kinds: list[str], *, all_done: Callable[[], bool] | None = None) -> None:
        self.kinds = frozenset(kinds)
        self._all_done_fn = all_done
        self._status: dict[str, str] = {}
        self._unfinished: set[str] = set()
        self._was_all_done = False
        self.types = self.kinds - DERIVED_NOTIFICATIONS
        if self.kinds & DERIVED_NOTIFICATIONS:
            self.types |= {"tasks.changed"}

    def notice(self, event: Event) -> list[Notification]:
        if event.type not in self.types or event.type.startswith("notify."):
            return []
        if event.type != "tasks.changed":
            return [_describe(event)]
        out: list[Notification] = []
        finished_some = False
        for task in event.data.get("tasks", []):
            tid, status = str(task.get("id")), str(task.get("status"))
            before = self._status.get(tid)
            self._status[tid] = status
            if status in _FINISHED:
                self._unfinished.discard(tid)
                finished_some = finished_some or before != status
            else:
                self._unfinished.add(tid)
            if status == "failed" and before != "failed" and "task.failed" in self.kinds:
                error = _short(task.get("error") or "no error recorded")
                out.append(Notification("task.failed", f"gridd: task {tid} failed", error, event))
        done = self._all_done()
        if done and finished_some and not self._was_all_done and "tasks.all_done" in self.kinds:
            body = "every task is done or cancelled"
            out.append(Notification("tasks.all_done", "gridd: all tasks done", body, event))
        self._was_all_done = done
        return out

    def _all_done(self) -> bool:
        if self._all_done_fn is not None:
            return self._all_done_fn()
        return bool(self._status) and not self._unfinished


def _describe(event: Event) -> Notification:
    d = event.data
    if event.type == "agent.question":
        who = d.get("agentId", "an agent")
        return Notification(
            event.type, f"gridd: question from {who}", _short(d.get("question", "")), event
        )
    if event.type == "session.stopped":
        forced = " (forced)" if d.get("force") else ""
        body = f"reason: {d.get('reason', 'unknown')}{forced}"
        return Notification(event.type, "gridd: session stopped", body, event)
    if event.type == "agent.stalled":
        who = d.get("agentId", "an agent")
        body = _short(d.get("reason") or d.get("message") or f"task {d.get('taskId', '?')}")
        return Notification(event.type, f"gridd: agent {who} stalled", body, event)
    return Notification(event.type, f"gridd: {event.type}", _short(json.dumps(d)), event)


class Coalescer:
    """Pure: the first of identical notifications goes out, repeats within the window are
    counted and come out as one summary when the window closes (``now`` is passed in)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._open: dict[tuple[str, str, str], tuple[float, Notification]] = {}

    def offer(self, n: Notification, now: float) -> Notification | None:
        if self.window <= 0:
            return n
        opened = self._open.get(n.key)
        if opened is None:
            self._open[n.key] = (now + self.window, n)
            return n
        closes, first = opened
        self._open[n.key] = (closes, replace(n, count=first.count + 1))
        return None

    def due(self, now: float) -> list[Notification]:
        closed = [k for k, (closes, _) in self._open.items() if closes <= now]
        return [s for k in closed if (s := self._summary(k)) is not None]

    def flush(self) -> list[Notification]:
        return [s for k in list(self._open) if (s := self._summary(k)) is not None]

    def next_deadline(self) -> float | None:
        return min((closes for closes, _ in self._open.values()), default=None)

    def _summary(self, key: tuple[str, str, str]) -> Notification | None:
        _, last = self._open.pop(key)
        return replace(last, title=f"{last.title} (x{last.count})") if last.count > 1 else None


async def _run(argv: list[str], stdin: bytes | None, timeout: float) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise _Failed(f"{argv[0]} timed out after {timeout:g}s") from None
    if proc.returncode != 0:
        tail = _short(err.decode(errors="replace"), 300)
        raise _Failed(f"{argv[0]} exited {proc.returncode}: {tail}")


def _applescript(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Notifier:
    """Owns the listener, the queue and the worker; ``start()`` then ``await stop()``."""

    def __init__(
        self,
        settings: NotificationSettings,
        *,
        bus: EventBus,
        background: Background,
        workspace_root: Path,
        all_done: Callable[[], bool] | None = None,
        path: str = os.defpath,
        platform: str = sys.platform,
        backoff_seconds: float = 0.5,
    ) -> None:
        self.settings = settings
        self._bus = bus
        self._background = background
        self._workspace = str(workspace_root)
        self._rules = NotificationRules(settings.events, all_done=all_done)
        self._coalescer = Coalescer(settings.coalesce_seconds)
        self._queue: asyncio.Queue[Notification | None] = asyncio.Queue(settings.queue_size + 1)
        self._backoff = backoff_seconds
        self._platform = platform
        tool = {"linux": "notify-send", "darwin": "osascript"}.get(platform)
        self._desktop = shutil.which(tool, path=path) if tool else None
        self._desktop_skip: str | None = None
        if settings.desktop and self._desktop is None:
            self._desktop_skip = f"{tool} not found" if tool else f"unsupported platform {platform}"
        self._http: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.dropped = 0
        self.sent = 0

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        self._bus.add_listener(self._on_event)
        self._task = self._background.supervise("notifier", self._worker)

    async def stop(self, timeout: float = 2.0) -> None:
        """Deliver what is queued (and pending summaries) for up to ``timeout``, then cancel."""
        self._closed = True
        self._put(None)
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=timeout)
            self._task.cancel()
            await asyncio.wait({self._task})

    # -- the listener: decide and enqueue, never block, never raise ---------------------------

    def _on_event(self, event: Event) -> None:
        if self._closed:
            return
        try:
            for n in self._rules.notice(event):
                self._put(n)
        except Exception:
            log.exception("notifications: cannot handle event %d (%s)", event.id, event.type)

    def _put(self, item: Notification | None) -> None:
        if self._queue.qsize() >= self.settings.queue_size:
            self._queue.get_nowait()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("notifications: queue full, %d dropped so far", self.dropped)
        self._queue.put_nowait(item)

    # -- the worker -----------------------------------------------------------------------------

    async def _worker(self) -> None:
        try:
            while True:
                deadline = self._coalescer.next_deadline()
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    item = await asyncio.wait_for(self._queue.get(), wait)
                except TimeoutError:
                    item = None
                    stopping = False
                else:
                    stopping = item is None
                for summary in self._coalescer.due(time.monotonic()):
                    await self._deliver(summary)
                if stopping:
                    for summary in self._coalescer.flush():
                        await self._deliver(summary)
                    return
                if item is not None and (n := self._coalescer.offer(item, time.monotonic())):
                    await self._deliver(n)
        finally:
            if self._http is not None:
                await self._http.close()

    async def _deliver(self, n: Notification) -> None:
        try:
            await self._send_all(n)
        except Exception:  # a bug here must not end the worker: log it and go on
            log.exception("notifications: cannot deliver for event %d", n.event.id)

    async def _send_all(self, n: Notification) -> None:
        payload = {
            "event": n.event.wire(),
            "title": n.title,
            "body": n.body,
            "kind": n.kind,
            "count": n.count,
            "workspace": self._workspace,
        }
        data = json.dumps(payload).encode()
        sends = []
        if self.settings.webhook_url:
            sends.append(self._guard("webhook", n, self._webhook(data)))
        if self.settings.command:
            sends.append(self._guard("command", n, _run(self.settings.command, data, self._t)))
        if self.settings.desktop and self._desktop is not None:
            sends.append(self._guard("desktop", n, self._desktop_send(n)))
        elif self._desktop_skip is not None:
            self._publish("notify.skipped", {"channel": "desktop", "reason": self._desktop_skip})
            self._desktop_skip = None
        await asyncio.gather(*sends)
        self.sent += 1

    @property
    def _t(self) -> float:
        return self.settings.timeout_seconds

    async def _guard(self, channel: str, n: Notification, send: Awaitable[None]) -> None:
        try:
            await send
        except Exception as exc:
            error = str(exc) if isinstance(exc, _Failed) else f"{type(exc).__name__}: {exc}"
            log.warning("notifications: %s failed for event %d: %s", channel, n.event.id, error)
            self._publish(
                "notify.failed", {"channel": channel, "error": error, "eventId": n.event.id}
            )

    def _publish(self, type_: str, data: dict[str, Any]) -> None:
        try:
            self._bus.publish(type_, data)
        except Exception:
            log.exception("notifications: cannot publish %s", type_)

    async def _webhook(self, body: bytes) -> None:
        # Imported on first use: most workspaces never configure a webhook, and aiohttp
        # costs ~0.1 s of start-up and ~10 MB of memory.
        import aiohttp

        assert self.settings.webhook_url is not None
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._t))
        headers = {"Content-Type": "application/json", **self.settings.webhook_headers}
        error = ""
        for attempt in range(self.settings.attempts):
            if attempt:
                await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                async with self._http.post(
                    self.settings.webhook_url, data=body, headers=headers
                ) as resp:
                    if resp.status < 300:
                        return
                    error = f"HTTP {resp.status}"
                    if resp.status < 500 and resp.status != 429:
                        break  # the request itself is wrong: retrying will not help
            except TimeoutError:
                error = f"timed out after {self._t:g}s"
            except aiohttp.ClientError as exc:
                error = f"{type(exc).__name__}: {exc}"
        tries = attempt + 1
        raise _Failed(f"{error} (after {tries} attempt{'s' if tries > 1 else ''})")

    async def _desktop_send(self, n: Notification) -> None:
        assert self._desktop is not None
        if self._platform == "darwin":
            script = (
                f"display notification {_applescript(n.body)} with title {_applescript(n.title)}"
            )
            argv = [self._desktop, "-e", script]
        else:
            argv = [self._desktop, "--app-name=gridd", n.title, n.body]
        await _run(argv, None, self._t)
