"""The state cache: tasks, agents and the session in memory, written through to SQLite.

Reads are instant (``GET /state`` never waits on I/O, the database being locked or not);
every mutation is persisted before it is visible (or, while the database is locked or
slow, queued by the store and visible at once: the cache is the source of truth, and what
is queued is committed in order, ``Store.durable``), bumps ``revision`` and wakes the
scheduler. Task changes are batched into one
``tasks.changed`` event per flush (the changed tasks, not the whole list: 10,000 tasks would
make every event megabytes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from gridd.changes import validated_agent, validated_task
from gridd.errors import Conflict, GriddError
from gridd.events import EventBus
from gridd.lean import BulkPace
from gridd.model import (
    Agent,
    AgentStatus,
    SessionState,
    Stats,
    Task,
    TaskStatus,
    utcnow,
)
from gridd.store import Store, encode_payload, task_rows

#: A big batch of new tasks is announced in ``tasks.changed`` events of this many tasks.
EVENT_CHUNK = 250
#: Agents' output positions are written to their rows at most this often (``note_output``).
POSITIONS_SAVE_SECONDS = 5.0


class GridState:
    def __init__(self, store: Store, bus: EventBus) -> None:
        self.store = store
        self.bus = bus
        self.tasks: dict[str, Task] = {t.id: t for t in store.load_tasks()}
        self.agents: dict[str, Agent] = {a.id: a for a in store.load_agents()}
        #: The agents not exited, kept as they change: /state never walks every agent
        #: that ever ran.
        self.live: dict[str, Agent] = {
            a.id: a for a in self.agents.values() if a.status != AgentStatus.EXITED
        }
        self.session = self._load_session()
        self.revision = 0
        self._dirty: dict[str, Task] = {}
        self._wakers: list[Callable[[], None]] = []
        self._task_json: dict[str, bytes] = {}
        self._agent_json: dict[str, bytes] = {}
        # Whole-list encodings and task counts, dropped on any change to what they cover.
        self._tasks_blob: bytes | None = None
        self._live_blob: bytes | None = None
        self._task_counts: tuple[dict[str, int], int, dict[str, int]] | None = None
        #: Task id -> its first live agent's id (``agent_for_task``); None: rebuild.
        self._by_task: dict[str, str] | None = None
        #: Agents whose published output position is newer than their row's (the log after
        #: the positions mark says it); the live ones at start, as the log may have said
        #: more than their rows when the last daemon stopped (``note_output``).
        self._unsaved: dict[str, None] = dict.fromkeys(self.live)
        self._positions_due = 0.0  # the first batch saves them all

    def _load_session(self) -> SessionState:
        raw = self.store.get_meta("session")
        if not raw:
            return SessionState()
        try:
            return SessionState.model_validate_json(raw)
        except ValueError as exc:  # kept aside and reported; the daemon starts regardless
            self.store.quarantine_row("meta", "session", raw, str(exc).splitlines()[0:3])
            return SessionState()

    # -- change notification ---------------------------------------------------------------

    def on_change(self, waker: Callable[[], None]) -> None:
        self._wakers.append(waker)

    def touch(self) -> None:
        self.revision += 1
        for waker in self._wakers:
            waker()

    def flush(self) -> None:
        """Publish one ``tasks.changed`` for everything changed since the last flush."""
        if not self._dirty:
            return
        changed = [t.wire() for t in self._dirty.values()]
        self.bus.publish("tasks.changed", {"tasks": changed, "partial": True})
        self._dirty.clear()  # only once published: a full disk keeps them for the next flush

    # -- tasks -------------------------------------------------------------------------------

    def add_tasks(self, tasks: Iterable[Task]) -> list[Task]:
        tasks = list(tasks)
        with self.store.transaction():
            self.store.save_tasks(tasks)
        for task in tasks:
            self._remember(task)
        self.touch()
        return tasks

    async def add_tasks_yielding(
        self, tasks: list[Task], *, pace: BulkPace | None = None
    ) -> list[Task]:
        """``add_tasks`` for a batch of any size without holding the event loop: the rows
        and the ``tasks.changed`` events (``EVENT_CHUNK`` tasks each) are encoded a chunk per
        turn of the loop (``pace``), then written in one transaction (committed on the
        store's writer thread) and taken into the cache at once. ``flush`` has nothing left
        to say about them. An id taken meanwhile (by another request, while this one was
        encoded) refuses the whole batch, as a duplicate does."""
        pace = pace or BulkPace()
        rows: list[tuple[str, str, str]] = []
        datas: list[dict[str, Any]] = []
        payloads: list[str] = []
        by_id: dict[str, Task] = {}
        for start in range(0, len(tasks), EVENT_CHUNK):
            chunk = tasks[start : start + EVENT_CHUNK]
            rows += task_rows(chunk)
            data = {"tasks": [t.wire() for t in chunk], "partial": True}
            datas.append(data)
            payloads.append(encode_payload(data))
            by_id.update((t.id, t) for t in chunk)
            await pace.step(len(chunk))
        if not self.tasks.keys().isdisjoint(by_id):  # taken meanwhile by another request
            taken = next(task_id for task_id in by_id if task_id in self.tasks)
            message = f"duplicate task id {taken!r}"
            problem = {"kind": "duplicate", "message": message, "ids": [taken]}
            raise Conflict(message, code="task_exists", details={"problems": [problem]})
        with self.store.transaction(wait=False):  # seconds to commit: never waited for here
            self.store.save_task_rows(rows)
            self.bus.publish_many("tasks.changed", datas, payloads=payloads)
        del rows, datas, payloads
        # All at once (a dict update), as ``_remember`` would one by one: new tasks have no
        # cached encoding, and these need no flush.
        self.tasks.update(by_id)
        for task_id in [i for i in self._dirty if i in by_id]:
            del self._dirty[task_id]
        self._tasks_blob = None
        self._task_counts = None
        self.touch()
        return tasks

    def update_task(self, task_id: str, **changes: Any) -> Task:
        """Change a task's fields (never its status: that is ``gridd.lifecycle``'s job),
        validated as the API validates a task."""
        _no_status("task", changes)
        updated = validated_task(self.tasks[task_id], {**changes, "updated_at": utcnow()})
        self.write_tasks([updated])
        return updated

    def update_tasks(self, updates: dict[str, dict[str, Any]]) -> None:
        now = utcnow()
        new = []
        for task_id, changes in updates.items():
            _no_status("task", changes)
            new.append(validated_task(self.tasks[task_id], {**changes, "updated_at": now}))
        self.write_tasks(new)

    def write_tasks(self, tasks: list[Task]) -> None:
        """Persist already validated tasks, then make them visible. Only this module and
        ``gridd.lifecycle`` call it."""
        if len(tasks) == 1:
            self.store.save_tasks(tasks)  # one statement: atomic by itself
        else:
            with self.store.transaction():
                self.store.save_tasks(tasks)
        for task in tasks:
            self._remember(task)
        self.touch()

    def _remember(self, task: Task) -> None:
        self.tasks[task.id] = task
        self._dirty[task.id] = task
        self._task_json.pop(task.id, None)
        self._tasks_blob = None
        self._task_counts = None

    def statuses(self) -> dict[str, TaskStatus]:
        return {t.id: t.status for t in self.tasks.values()}

    def tasks_json(self) -> bytes:
        """All tasks as a JSON array, from a per-task cache (fast with 10,000 tasks); the
        array itself is kept until a task changes."""
        if self._tasks_blob is not None:
            return self._tasks_blob
        parts = []
        cache = self._task_json
        for task_id, task in self.tasks.items():
            blob = cache.get(task_id)
            if blob is None:
                blob = json.dumps(task.wire(), separators=(",", ":")).encode()
                cache[task_id] = blob
            parts.append(blob)
        self._tasks_blob = b"[" + b",".join(parts) + b"]"
        return self._tasks_blob

    def live_agents_json(self) -> bytes:
        """The live agents as a JSON array, each encoded once per change."""
        if self._live_blob is not None:
            return self._live_blob
        parts = []
        cache = self._agent_json
        for agent_id, agent in self.live.items():
            blob = cache.get(agent_id)
            if blob is None:
                blob = json.dumps(agent.wire(), separators=(",", ":")).encode()
                cache[agent_id] = blob
            parts.append(blob)
        self._live_blob = b"[" + b",".join(parts) + b"]"
        return self._live_blob

    def stats(self) -> Stats:
        if self._task_counts is None:
            counts: dict[str, int] = {}
            merged: dict[str, int] = {}
            waiting = 0
            for task in self.tasks.values():
                counts[task.status.value] = counts.get(task.status.value, 0) + 1
                waiting += task.waiting_since is not None
                if task.merged_into is not None and task.status == TaskStatus.DONE:
                    merged[task.merged_into] = merged.get(task.merged_into, 0) + 1
            self._task_counts = counts, waiting, merged
        counts, waiting, merged = self._task_counts
        live_cost = sum(a.cost_usd or 0.0 for a in self.live.values())
        return Stats(
            **{k: v for k, v in counts.items() if k in Stats.model_fields},
            waiting=waiting,
            spent_usd=round(self.session.spent_usd + live_cost, 6),
            merged_by_branch=merged,
        )

    # -- agents --------------------------------------------------------------------------------

    def put_agent(self, agent: Agent) -> Agent:
        self.store.save_agent(agent)
        self._remember_agent(agent)
        self.touch()
        return agent

    def update_agent(self, agent_id: str, *, persist: bool = True, **changes: Any) -> Agent:
        """Change an agent's fields (never its status: that is ``gridd.lifecycle``'s job).
        Persisted changes are validated; ``persist=False`` is for derivable, hot fields."""
        _no_status("agent", changes)
        agent = self.agents[agent_id]
        if persist:
            agent = validated_agent(agent, changes)
            self.store.save_agent(agent)
        else:
            agent = agent.model_copy(update=changes)
        self._remember_agent(agent)
        return agent

    def note_output(self, positions: list[tuple[str, int, str]]) -> None:
        """Agents' published output positions ``(agent_id, output_seq, last_output)``, in
        the caller's transaction (with the output events). The cache takes them at the
        commit, so a rolled-back batch leaves it as the database is.

        The agents' rows are written only every ``POSITIONS_SAVE_SECONDS`` (every agent
        that published meanwhile, in this same transaction, with the mark saying which
        events they cover): a row per line printed cost more than the line's event. Until
        then the events themselves, committed with the position they imply, are the
        record (``Store.load_agents``), so a daemon killed at any point recovers exactly."""
        store = self.store

        def remember() -> None:
            for agent_id, seq, last in positions:
                agent = self.agents.get(agent_id)
                if agent is not None:
                    # One copy per agent and batch (not per line): the cached model is
                    # replaced, never edited in place.
                    agent = agent.model_copy(update={"output_seq": seq, "last_output": last})
                    self._remember_agent(agent)
                    self._unsaved[agent_id] = None

        # Registered first: ``saved`` (when due) then forgets what this very batch wrote.
        store.after_commit(remember)
        if time.monotonic() >= self._positions_due:
            moved = {agent_id: (seq, last) for agent_id, seq, last in positions}
            saving = [*self._unsaved.keys() - moved.keys(), *moved]
            rows = []
            for agent_id in saving:
                agent = self.agents.get(agent_id)
                if agent_id in moved:
                    seq, last = moved[agent_id]
                    rows.append((seq, last, agent_id))
                elif agent is not None:
                    rows.append((agent.output_seq, agent.last_output, agent_id))
            store.save_output_positions(rows, through=store.last_appended_id)

            def saved() -> None:
                for agent_id in saving:
                    self._unsaved.pop(agent_id, None)
                self._positions_due = time.monotonic() + POSITIONS_SAVE_SECONDS

            store.after_commit(saved)  # registered after ``remember``: it runs second

    def save_positions_now(self) -> None:
        """Write the output position of every agent that published since the last save to
        its row, and move the mark to the last event (outside any transaction). Called
        before old events are pruned: a mark left behind while agents are quiet would
        otherwise keep every later event from being pruned, however many there are."""
        store = self.store
        rows = [
            (agent.output_seq, agent.last_output, agent.id)
            for agent_id in self._unsaved
            if (agent := self.agents.get(agent_id)) is not None
        ]
        with store.transaction():
            store.save_output_positions(rows, through=store.last_appended_id)
        self._unsaved.clear()
        self._positions_due = time.monotonic() + POSITIONS_SAVE_SECONDS

    def write_agent(self, agent: Agent) -> None:
        """Persist an already validated agent. Only ``gridd.lifecycle`` calls it. (No
        wake-up: whoever needs the scheduler to look again touches the state itself.)"""
        self.store.save_agent(agent)
        self._remember_agent(agent)

    def _remember_agent(self, agent: Agent) -> None:
        self.agents[agent.id] = agent
        self._agent_json.pop(agent.id, None)
        self._live_blob = None
        if agent.status == AgentStatus.EXITED:
            if self.live.pop(agent.id, None) is not None:
                self._by_task = None
        else:
            if agent.id not in self.live:
                self._by_task = None
            self.live[agent.id] = agent

    def live_agents(self) -> list[Agent]:
        return list(self.live.values())

    def agent_for_task(self, task_id: str) -> Agent | None:
        """The (first) live agent of a task. Through an index built from ``live`` when its
        members change: the radar asks for every live task each sweep, and a walk of
        hundreds of agents per task made that quadratic."""
        if self._by_task is None:
            index: dict[str, str] = {}
            for agent in self.live.values():
                index.setdefault(agent.task_id, agent.id)
            self._by_task = index
        agent_id = self._by_task.get(task_id)
        return self.live.get(agent_id) if agent_id is not None else None

    # -- session -------------------------------------------------------------------------------

    def set_session(self, session: SessionState) -> None:
        self.store.set_meta("session", session.model_dump_json())
        self.session = session
        self.touch()


class StatusBypass(GriddError):
    """A status change that tried to go around ``gridd.lifecycle`` (a bug)."""

    code = "status_bypass"


def _no_status(kind: str, changes: dict[str, Any]) -> None:
    if "status" in changes or "status_reason" in changes:
        raise StatusBypass(
            f"a {kind}'s status changes only through gridd.lifecycle (move_{kind})",
            details={"fields": sorted(changes)},
        )
