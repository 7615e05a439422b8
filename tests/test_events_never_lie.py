"""Events never lie: an event reaches subscribers only once its transaction has committed,
a rolled-back event is never seen, and ids only ever go up: across rollbacks, a write
that fails because the disk is full, and restarts. Real SQLite, real event bus."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gridd.errors import StoreError
from gridd.events import EventBus
from gridd.model import Event
from gridd.store import Store


def drain(queue: asyncio.Queue[Event | None]) -> list[Event]:
    out = []
    while not queue.empty():
        item = queue.get_nowait()
        if item is not None:
            out.append(item)
    return out


async def test_an_event_inside_a_transaction_is_heard_only_after_commit(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "gridd.db")
    bus = EventBus(store, queue_size=100)
    heard: list[int] = []
    bus.add_listener(lambda e: heard.append(e.id))
    sub = bus.subscribe()
    try:
        with store.transaction():
            event = bus.publish("t.inside", {"n": 1})
            assert heard == [] and sub.queue.empty()
            assert bus.last_id < event.id  # a new stream must not start past it either
        assert heard == [event.id]
        assert [e.id for e in drain(sub.queue)] == [event.id]
        assert bus.last_id == event.id
    finally:
        store.close()


async def test_a_rolled_back_event_is_never_heard_and_its_id_never_reused(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "gridd.db")
    bus = EventBus(store, queue_size=100)
    sub = bus.subscribe()
    try:
        before = bus.publish("t.before", {})
        with pytest.raises(RuntimeError), store.transaction():
            doomed = bus.publish("t.doomed", {"secret": True})
            raise RuntimeError("the rest of the change failed")
        after = bus.publish("t.after", {})
        seen = drain(sub.queue)
        assert [e.type for e in seen] == ["t.before", "t.after"]
        assert before.id < doomed.id < after.id
        assert [e.type for e in store.events_after(0)] == ["t.before", "t.after"]
    finally:
        store.close()


async def test_a_failed_commit_publishes_nothing_and_ids_keep_increasing(tmp_path: Path) -> None:
    """A COMMIT that fails (here: the writer's connection refuses writes, as a read-only
    disk refuses them) rolls back, publishes nothing, raises a StoreError. (A database
    locked by someone else is no failure: the write waits for it, ``test_store_offloop``.)"""
    path = tmp_path / "gridd.db"
    store = Store.open(path)
    bus = EventBus(store, queue_size=100)
    sub = bus.subscribe()
    writer = store._writer.conn
    try:
        first = bus.publish("t.first", {})
        writer.execute("PRAGMA query_only = 1")
        with pytest.raises(StoreError), store.transaction():
            bus.publish("t.lost", {})
        writer.execute("PRAGMA query_only = 0")
        assert [e.type for e in drain(sub.queue)] == ["t.first"]
        later = bus.publish("t.later", {})
        assert later.id > first.id
        assert [e.type for e in drain(sub.queue)] == ["t.later"]
        assert [e.type for e in store.events_after(0)] == ["t.first", "t.later"]
    finally:
        store.close()


async def test_ids_stay_strictly_increasing_across_a_rollback_and_a_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gridd.db"
    store = Store.open(path)
    bus = EventBus(store, queue_size=100)
    seen: list[int] = []
    bus.add_listener(lambda e: seen.append(e.id))
    for _ in range(3):
        bus.publish("t.x", {})
    with pytest.raises(RuntimeError), store.transaction():
        bus.publish("t.rolled", {})
        raise RuntimeError
    bus.publish("t.y", {})
    store.close()
    store = Store.open(path)
    bus = EventBus(store, queue_size=100)
    bus.add_listener(lambda e: seen.append(e.id))
    try:
        bus.publish("t.z", {})
        assert seen == sorted(set(seen)) and len(seen) == 5
        assert [e.id for e in store.events_after(0)] == seen
    finally:
        store.close()


def test_non_finite_numbers_never_reach_the_event_log(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "gridd.db")
    try:
        with pytest.raises(ValueError):
            store.append_event("t.bad", {"x": float("inf")})
    finally:
        store.close()
