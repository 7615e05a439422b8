"""The domain tables: tasks, agents (with their output positions) and questions, each
row a model's JSON document keyed by id; a row that no longer loads is moved aside
into ``meta`` and reported, never fatal."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import TypeVar

from pydantic import BaseModel

from gridd.dbguard import Problem
from gridd.model import Agent, Question, Task
from gridd.store.eventlog import POSITIONS_MARK, EventLog
from gridd.store.schema import OpenReport

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

#: The last line shown of an agent's output (``Agent.last_output``) is cut to this.
LAST_LINE_CHARS = 300


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (its end, at most ``LAST_LINE_CHARS``); ""."""
    line = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "")
    return line[-LAST_LINE_CHARS:]


class Tables(EventLog):
    """The ``tasks``, ``agents`` and ``questions`` tables."""

    report: OpenReport

    def save_tasks(self, tasks: Iterable[Task]) -> None:
        """Insert or replace tasks (call inside ``transaction()`` for many)."""
        self.save_task_rows(task_rows(tasks))

    def save_task_rows(self, rows: list[tuple[str, str, str]]) -> None:
        """``save_tasks`` with the rows already encoded (``task_rows``)."""
        self._write(
            lambda c: c.executemany(
                "INSERT INTO tasks(id, status, doc) VALUES (?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET status = excluded.status, doc = excluded.doc",
                rows,
            )
        )

    def load_tasks(self) -> list[Task]:
        return self._load("tasks", Task)

    def save_agent(self, agent: Agent) -> None:
        row = (agent.id, agent.task_id, agent.status.value, agent.model_dump_json())
        self._write(
            lambda c: c.execute(
                "INSERT INTO agents(id, task_id, status, doc) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET status = excluded.status, doc = excluded.doc",
                row,
            )
        )

    def save_output_positions(
        self, rows: Iterable[tuple[int, str, str]], *, through: int | None = None
    ) -> None:
        """Each agent's published output position, ``(output_seq, last_output, agent_id)``:
        two fields of its document set in place (SQLite's ``json_set``), with no model
        validated or encoded. ``through``: every ``agent.output`` event up to this id is
        now reflected in its agent's row (``load_agents`` reads only the log after it).
        Saved every few seconds, not per line (``GridState.note_output``)."""
        listed = list(rows)
        self._write(
            lambda c: c.executemany(
                "UPDATE agents SET doc = json_set(doc, '$.output_seq', ?, '$.last_output', ?)"
                " WHERE id = ?",
                listed,
            )
        )
        if through is not None:
            self.set_meta(POSITIONS_MARK, str(through))

    def load_agents(self) -> list[Agent]:
        """Every agent, its output position the later of its row's and the ``agent.output``
        events logged after the positions mark: both are committed with the events, so a
        daemon killed at any point gets back exactly what it had published."""
        agents = self._load("agents", Agent)
        tail = self._output_tail()
        if not tail:
            return agents
        loaded = []
        for agent in agents:
            found = tail.get(agent.id)
            if found is not None and found[0] > agent.output_seq:
                seq, last = found
                agent = agent.model_copy(
                    update={"output_seq": seq, "last_output": last or agent.last_output}
                )
            loaded.append(agent)
        return loaded

    def _output_tail(self) -> dict[str, tuple[int, str]]:
        """Agent id -> (highest seq, its last line shown) among ``agent.output`` events
        after the positions mark."""
        mark = self.positions_mark()
        if mark is None:
            return {}
        rows = self._exec(
            "SELECT data FROM events WHERE type = 'agent.output' AND id > ? ORDER BY id",
            (mark,),
        ).fetchall()
        tail: dict[str, tuple[int, str]] = {}
        for (raw,) in rows:
            try:
                data = json.loads(raw)
                agent_id, seq, chunk = str(data["agentId"]), int(data["seq"]), data["chunk"]
            except (ValueError, KeyError, TypeError):
                continue  # not ours to judge here; the log keeps it as it is
            before = tail.get(agent_id)
            if before is None or seq > before[0]:
                tail[agent_id] = (seq, last_line(str(chunk)) or (before[1] if before else ""))
        return tail

    def save_question(self, question: Question) -> None:
        row = (question.id, question.agent_id, question.status.value, question.model_dump_json())
        self._write(
            lambda c: c.execute(
                "INSERT INTO questions(id, agent_id, status, doc) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET status = excluded.status, doc = excluded.doc",
                row,
            )
        )

    def load_questions(self) -> list[Question]:
        return self._load("questions", Question)

    def _load(self, table: str, model: type[M]) -> list[M]:
        """Every row of ``table`` that loads; one that does not is moved aside (into
        ``meta`` as ``quarantined.<table>.<id>``) and reported, never fatal."""
        rows = self._exec(f"SELECT id, doc FROM {table} ORDER BY rowid").fetchall()
        loaded = []
        for row_id, doc in rows:
            try:
                loaded.append(model.model_validate_json(doc))
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                self.quarantine_row(table, str(row_id), str(doc), str(exc).splitlines()[0:3])
        return loaded

    def quarantine_row(self, table: str, row_id: str, doc: str, reason: list[str]) -> None:
        key = f"quarantined.{table}.{row_id}.{int(time.time())}"
        column = "key" if table == "meta" else "id"
        with self.transaction():
            self.set_meta(key, json.dumps({"doc": doc, "reason": reason}))
            self._write(lambda c: c.execute(f"DELETE FROM {table} WHERE {column} = ?", (row_id,)))
            if table == "meta":
                self._forget_meta(row_id)
        problem = Problem(
            "row_unreadable",
            f"{table} row {row_id!r} cannot be loaded ({'; '.join(reason)}); kept aside in"
            f" the meta table as {key!r}",
            (key,),
        )
        log.error("%s", problem.message)
        self.report.problems.append(problem)


def task_rows(tasks: Iterable[Task]) -> list[tuple[str, str, str]]:
    """Tasks as rows of the ``tasks`` table: ``(id, status, doc)``."""
    return [(t.id, t.status.value, t.model_dump_json()) for t in tasks]
