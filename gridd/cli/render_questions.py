"""How ``gridctl`` shows the questions agents asked: the questions table."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from rich.console import RenderableType

from gridd.cli.render import (
    FittedTable,
    ago,
    brief,
    clip,
    plain_texts,
    waited,
)
from gridd.model import (
    Question,
    QuestionStatus,
)


def _question_wait(question: Question, *, now: datetime | None = None) -> str:
    if question.status == QuestionStatus.PENDING:
        return f"waiting {waited(question.asked_at, now=now)}"
    if question.answered_at is not None:
        return f"answered after {brief((question.answered_at - question.asked_at).total_seconds())}"
    return f"asked {ago(question.asked_at, now=now)}"


def _question_status(question: Question) -> str:
    if question.status == QuestionStatus.ANSWERED:
        return f"answered: {clip(question.answer or '', 40)}"
    if question.status == QuestionStatus.CLOSED:
        return f"closed: {question.closed_reason or 'no reason given'}"
    return question.status.value


def questions_table(
    questions: Iterable[Question],
    *,
    empty: str = "no pending questions",
    title: str = "pending questions",
    now: datetime | None = None,
    titled: bool = False,
) -> RenderableType:
    """Questions, one row each: id, agent, task, type, question, options, how long it waited
    (and, when any is no longer pending, its status and answer)."""
    rows = list(questions)
    settled = any(q.status != QuestionStatus.PENDING for q in rows)
    names = ["question id", "agent", "task", "type", "question", "options", "waited"]
    if settled:
        names.append("status")
    cells = []
    for q in rows:
        values = [
            q.id,
            q.agent_id,
            q.task_id,
            q.type,
            clip(q.question, 200),
            " / ".join(q.options) or "-",
            _question_wait(q, now=now),
        ]
        if settled:
            values.append(_question_status(q))
        cells.append(dict(zip(names, plain_texts(*values), strict=True)))
    return FittedTable(
        f"{title} ({len(rows)})",
        names,
        cells,
        give_way=("type", "waited"),
        wrapped={"question": 40, "options": 24, "status": 30},
        empty=empty,
        titled=titled,
    )
