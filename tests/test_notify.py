"""Notifications: a real local webhook server, real commands, a real bus over a real store."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gridd.background import Background
from gridd.errors import ConfigError
from gridd.events import EventBus
from gridd.model import Event
from gridd.notify import Coalescer, Notification, Notifier
from gridd.settings import NotificationSettings, parse_settings
from gridd.store import Store
from tests.support.waits import until


class Hook:
    """A webhook receiver on loopback: answers with scripted statuses (0 = never answers)."""

    def __init__(self) -> None:
        self.url = ""
        self.statuses: list[int] = []
        self.hits = 0
        self.delivered: list[dict[str, Any]] = []  # payloads answered with 2xx
        self.headers: list[dict[str, str]] = []
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        status = self.statuses.pop(0) if self.statuses else 200
        payload = await request.json()
        self.headers.append(dict(request.headers))
        if status == 0:
            await self.release.wait()
            return web.Response(status=200)
        if status < 300:
            self.delivered.append(payload)
        return web.Response(status=status)


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    h = Hook()
    app = web.Application()
    app.router.add_post("/hook", h.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    h.url = str(server.make_url("/hook"))
    yield h
    h.release.set()
    await server.close()


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[EventBus]:
    store = Store.open(tmp_path / "g.db")
    yield EventBus(store, queue_size=100)
    store.close()


@pytest.fixture
def no_tools(tmp_path: Path) -> str:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    return str(empty)


@asynccontextmanager
async def running(
    bus: EventBus,
    root: Path,
    *,
    path: str,
    all_done: Callable[[], bool] | None = None,
    stop_timeout: float = 2.0,
    platform: str = "linux",
    **settings: Any,
) -> AsyncIterator[Notifier]:
    settings.setdefault("desktop", False)
    settings.setdefault("coalesce_seconds", 0)
    background = Background()
    notifier = Notifier(
        NotificationSettings(**settings),
        bus=bus,
        background=background,
        workspace_root=root,
        all_done=all_done,
        path=path,
        platform=platform,
        backoff_seconds=0.01,
    )
    notifier.start()
    try:
        yield notifier
    finally:
        await notifier.stop(timeout=stop_timeout)
        await background.stop()
        assert background.names == []


def events(bus: EventBus, type_: str) -> list[Event]:
    return bus.replay(0, types=[type_])


def question(bus: EventBus, text: str = "Which database?", agent: str = "claude-3") -> Event:
    return bus.publish("agent.question", {"agentId": agent, "question": text, "options": []})


# -- webhook -------------------------------------------------------------------------------


async def test_webhook_receives_the_event_title_and_body(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    headers = {"X-Token": "s3cret"}
    async with running(bus, tmp_path, path=no_tools, webhook_url=hook.url, webhook_headers=headers):
        asked = question(bus)
        await until(lambda: len(hook.delivered) == 1, timeout=5.0)
    payload = hook.delivered[0]
    assert payload["title"] == "gridd: question from claude-3"
    assert payload["body"] == "Which database?"
    assert payload["workspace"] == str(tmp_path)
    assert payload["event"]["id"] == asked.id
    assert payload["event"]["type"] == "agent.question"
    assert payload["event"]["data"]["question"] == "Which database?"
    assert set(payload["event"]) == {"id", "type", "data", "ts"}
    assert hook.headers[0]["X-Token"] == "s3cret"
    assert events(bus, "notify.failed") == []


async def test_webhook_is_retried_after_a_server_error(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    hook.statuses = [500]
    async with running(bus, tmp_path, path=no_tools, webhook_url=hook.url):
        question(bus)
        await until(lambda: len(hook.delivered) == 1, timeout=5.0)
    assert hook.hits == 2
    assert events(bus, "notify.failed") == []


async def test_webhook_failing_every_attempt_becomes_a_notify_failed_event(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    hook.statuses = [500, 503, 500]
    async with running(bus, tmp_path, path=no_tools, webhook_url=hook.url, attempts=3):
        asked = question(bus)
        await until(lambda: bool(events(bus, "notify.failed")), timeout=5.0)
    assert hook.hits == 3
    [failed] = events(bus, "notify.failed")
    assert failed.data["channel"] == "webhook"
    assert failed.data["eventId"] == asked.id
    assert "HTTP 500" in failed.data["error"] and "3 attempts" in failed.data["error"]


async def test_webhook_client_error_is_not_retried(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    hook.statuses = [404]
    async with running(bus, tmp_path, path=no_tools, webhook_url=hook.url, attempts=3):
        question(bus)
        await until(lambda: bool(events(bus, "notify.failed")), timeout=5.0)
    assert hook.hits == 1
    assert "HTTP 404" in events(bus, "notify.failed")[0].data["error"]


async def test_webhook_that_never_answers_times_out_into_a_failure(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    hook.statuses = [0, 0]
    started = time.monotonic()
    async with running(
        bus, tmp_path, path=no_tools, webhook_url=hook.url, timeout_seconds=0.2, attempts=2
    ):
        question(bus)
        await until(lambda: bool(events(bus, "notify.failed")), timeout=5)
    assert time.monotonic() - started < 5
    [failed] = events(bus, "notify.failed")
    assert "timed out" in failed.data["error"]
    assert hook.hits == 2


# -- command hook and desktop ----------------------------------------------------------------


async def test_command_hook_gets_the_event_json_on_stdin(
    bus: EventBus, tmp_path: Path, no_tools: str
) -> None:
    out = tmp_path / "hook.json"
    script = f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())"
    async with running(bus, tmp_path, path=no_tools, command=[sys.executable, "-c", script]):
        stopped = bus.publish("session.stopped", {"reason": "user", "force": True})
        await until(out.exists, timeout=5.0)
        await until(lambda: out.read_text() != "", timeout=5.0)
    payload = json.loads(out.read_text())
    assert payload["event"]["id"] == stopped.id
    assert payload["title"] == "gridd: session stopped"
    assert payload["body"] == "reason: user (forced)"


async def test_command_exiting_non_zero_is_a_failure_and_the_worker_carries_on(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    command = [sys.executable, "-c", "import sys; sys.stderr.write('nope'); sys.exit(3)"]
    async with running(bus, tmp_path, path=no_tools, command=command, webhook_url=hook.url):
        question(bus, "first?")
        question(bus, "second?")
        await until(lambda: len(events(bus, "notify.failed")) == 2, timeout=5.0)
        await until(lambda: len(hook.delivered) == 2, timeout=5.0)
    failed = events(bus, "notify.failed")
    assert {f.data["channel"] for f in failed} == {"command"}
    assert "exited 3: nope" in failed[0].data["error"]


async def test_missing_command_binary_is_reported_not_raised(
    bus: EventBus, tmp_path: Path, no_tools: str
) -> None:
    async with running(bus, tmp_path, path=no_tools, command=[str(tmp_path / "no-such-hook")]):
        question(bus)
        await until(lambda: bool(events(bus, "notify.failed")), timeout=5.0)
    assert "FileNotFoundError" in events(bus, "notify.failed")[0].data["error"]


async def test_desktop_without_notify_send_is_skipped_with_one_note(
    bus: EventBus, tmp_path: Path, no_tools: str
) -> None:
    async with running(bus, tmp_path, path=no_tools, desktop=True) as notifier:
        for i in range(3):
            question(bus, f"question {i}?")
        await until(lambda: notifier.sent == 3, timeout=5.0)
    [skipped] = events(bus, "notify.skipped")
    assert skipped.data == {"channel": "desktop", "reason": "notify-send not found"}
    assert events(bus, "notify.failed") == []


async def test_desktop_runs_notify_send_with_title_and_body(bus: EventBus, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log_file = tmp_path / "notify-send.log"
    fake = bin_dir / "notify-send"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(log_file)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    fake.chmod(0o755)
    async with running(bus, tmp_path, path=str(bin_dir), desktop=True):
        question(bus, "Use Postgres?")
        await until(log_file.exists, timeout=5.0)
    assert json.loads(log_file.read_text()) == [
        "--app-name=gridd",
        "gridd: question from claude-3",
        "Use Postgres?",
    ]
    assert events(bus, "notify.skipped") == []


async def test_desktop_on_macos_runs_osascript_with_quoted_text(
    bus: EventBus, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log_file = tmp_path / "osascript.log"
    fake = bin_dir / "osascript"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(log_file)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    fake.chmod(0o755)
    async with running(bus, tmp_path, path=str(bin_dir), desktop=True, platform="darwin"):
        question(bus, 'Delete "build\\"?')
        await until(log_file.exists, timeout=5.0)
    assert json.loads(log_file.read_text()) == [
        "-e",
        'display notification "Delete \\"build\\\\\\"?" with title "gridd: question from claude-3"',
    ]


# -- what notifies ----------------------------------------------------------------------------


async def test_identical_questions_in_a_burst_are_sent_once_then_summarised(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    async with running(bus, tmp_path, path=no_tools, webhook_url=hook.url, coalesce_seconds=0.3):
        for _ in range(20):
            question(bus, "Allow Bash(rm -rf build)?")
        await until(lambda: len(hook.delivered) == 2, timeout=5.0)
        await asyncio.sleep(0.4)  # no more windows to close
    first, summary = hook.delivered
    assert (first["title"], first["count"]) == ("gridd: question from claude-3", 1)
    assert summary["title"] == "gridd: question from claude-3 (x20)"
    assert summary["count"] == 20
    assert len(hook.delivered) == 2


async def test_distinct_questions_are_each_sent(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    async with running(bus, tmp_path, path=no_tools, webhook_url=hook.url, coalesce_seconds=30):
        question(bus, "a?", agent="claude-1")
        question(bus, "b?", agent="claude-1")
        question(bus, "a?", agent="claude-2")
        await until(lambda: len(hook.delivered) == 3, timeout=5.0)
    assert [p["count"] for p in hook.delivered] == [1, 1, 1]


async def test_stop_sends_the_pending_summary(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    async with running(bus, tmp_path, path=no_tools, webhook_url=hook.url, coalesce_seconds=30):
        for _ in range(3):
            question(bus)
        await until(lambda: len(hook.delivered) == 1, timeout=5.0)
    assert [p["count"] for p in hook.delivered] == [1, 3]


async def test_events_not_configured_send_nothing(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    async with running(
        bus, tmp_path, path=no_tools, webhook_url=hook.url, events=["session.stopped"]
    ):
        question(bus)
        bus.publish("agent.output", {"agentId": "a", "chunk": "x", "seq": 1})
        bus.publish("tasks.changed", {"tasks": [{"id": "t1", "status": "failed"}]})
        bus.publish("session.stopped", {"reason": "user", "force": False})
        await until(lambda: len(hook.delivered) == 1, timeout=5.0)
    assert [p["event"]["type"] for p in hook.delivered] == ["session.stopped"]


async def test_task_failure_and_all_done_are_derived_from_tasks_changed(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    def changed(*tasks: tuple[str, str]) -> None:
        data = [
            {"id": i, "status": s, "error": "boom" if s == "failed" else None} for i, s in tasks
        ]
        bus.publish("tasks.changed", {"tasks": data, "partial": True})

    async with running(bus, tmp_path, path=no_tools, webhook_url=hook.url):
        changed(("t1", "working"), ("t2", "ready"))
        changed(("t1", "failed"))
        changed(("t1", "failed"))  # still failed: not a new failure
        changed(("t1", "ready"))
        changed(("t1", "done"))
        changed(("t2", "cancelled"))
        changed(("t2", "cancelled"))  # already all done: said once
        bus.publish("agent.stalled", {"agentId": "claude-9", "taskId": "t3", "reason": "quiet"})
        await until(lambda: len(hook.delivered) == 3, timeout=5.0)
    assert [(p["kind"], p["title"], p["body"]) for p in hook.delivered] == [
        ("task.failed", "gridd: task t1 failed", "boom"),
        ("tasks.all_done", "gridd: all tasks done", "every task is done or cancelled"),
        ("agent.stalled", "gridd: agent claude-9 stalled", "quiet"),
    ]


async def test_all_done_asks_the_lead_when_given_a_callable(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    async with running(bus, tmp_path, path=no_tools, webhook_url=hook.url, all_done=lambda: False):
        bus.publish("tasks.changed", {"tasks": [{"id": "t1", "status": "done"}]})
        bus.publish("session.stopped", {"reason": "user"})
        await until(lambda: len(hook.delivered) == 1, timeout=5.0)
    assert hook.delivered[0]["kind"] == "session.stopped"


# -- never blocking ---------------------------------------------------------------------------


async def test_publishing_never_waits_for_a_stuck_webhook(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    hook.statuses = [0] * 3
    async with running(
        bus,
        tmp_path,
        path=no_tools,
        webhook_url=hook.url,
        queue_size=50,
        timeout_seconds=60,
        stop_timeout=0.2,
    ) as notifier:
        question(bus, "first")
        await until(lambda: hook.hits == 1, timeout=5.0)  # the worker is now stuck on the webhook
        started = time.monotonic()
        for i in range(10_000):
            question(bus, f"question {i}")
        elapsed = time.monotonic() - started
        assert notifier.queued <= 50
        assert notifier.dropped == 10_000 - 50
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 2
    assert elapsed < 10  # 10,000 log appends; nothing waited on the webhook


async def test_malformed_event_data_never_raises_into_publish(
    bus: EventBus, hook: Hook, tmp_path: Path, no_tools: str
) -> None:
    async with running(bus, tmp_path, path=no_tools, webhook_url=hook.url):
        bus.publish("tasks.changed", {"tasks": None})
        bus.publish("tasks.changed", {"tasks": ["not-a-task"]})
        bus.publish("session.stopped", {"reason": "user"})
        await until(lambda: len(hook.delivered) == 1, timeout=5.0)
    assert hook.delivered[0]["kind"] == "session.stopped"


# -- the pure parts -------------------------------------------------------------------------


def _n(title: str, event_id: int = 1) -> Notification:
    event = Event(id=event_id, type="agent.question", data={}, ts=datetime.now(UTC))
    return Notification("agent.question", title, "body", event)


def test_coalescer_merges_within_the_window_and_summarises_at_its_end() -> None:
    c = Coalescer(10)
    assert c.offer(_n("a", 1), now=0) is not None
    assert c.offer(_n("a", 2), now=1) is None
    assert c.offer(_n("a", 3), now=9) is None
    assert c.offer(_n("b", 4), now=9) is not None
    assert c.next_deadline() == 10
    assert c.due(now=9.5) == []
    [summary] = c.due(now=10)
    assert (summary.title, summary.count, summary.event.id) == ("a (x3)", 3, 3)
    assert c.due(now=19) == []  # "b" had no repeat: its window closes silently
    assert c.next_deadline() is None
    assert c.offer(_n("a", 5), now=20) is not None  # a new window


def test_notification_settings_are_validated() -> None:
    settings = parse_settings({"notifications": {"webhook_url": "https://example.test/h"}})
    assert settings.notifications.desktop is True
    assert "agent.question" in settings.notifications.events
    with pytest.raises(ConfigError, match=r"notifications\.webhook_url"):
        parse_settings({"notifications": {"webhook_url": "ftp://x"}})
    with pytest.raises(ConfigError, match=r"notifications\.webhok_url"):
        parse_settings({"notifications": {"webhok_url": "https://x"}})
