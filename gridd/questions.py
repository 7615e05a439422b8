"""Questions agents ask a human, persisted, answered exactly once, surviving restarts.

An adapter's ``Ask`` becomes a ``Question`` (stored, listed, emitted as ``agent.question``);
the task shows it is waiting. An answer is validated (409 when the question is gone or
already answered, 422 for an option that is not offered), encoded by the agent's adapter
and written to the agent's stdin. An agent that exits with a question open closes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gridd.adapters import base
from gridd.errors import Conflict, NotFound, ValidationFailed
from gridd.events import EventBus
from gridd.lifecycle import move_agent
from gridd.model import Agent, AgentStatus, Question, QuestionStatus, utcnow
from gridd.state import GridState
from gridd.store import Store

log = logging.getLogger(__name__)


class QuestionBook:
    def __init__(self, *, store: Store, state: GridState, bus: EventBus) -> None:
        self.store = store
        self.state = state
        self.bus = bus
        self.questions: dict[str, Question] = {q.id: q for q in store.load_questions()}
        #: The pending ones, kept as they change (/state lists them on every request).
        self._pending: dict[str, Question] = {
            q.id: q for q in self.questions.values() if q.status == QuestionStatus.PENDING
        }

    def pending(self) -> list[Question]:
        return list(self._pending.values())

    def pending_for(self, agent_id: str) -> list[Question]:
        return [q for q in self.pending() if q.agent_id == agent_id]

    def get(self, question_id: str) -> Question:
        question = self.questions.get(question_id)
        if question is None:
            raise NotFound(
                f"no question {question_id[:80]!r}",
                code="question_not_found",
                details={"id": question_id[:80]},
            )
        return question

    def _save(self, question: Question) -> Question:
        self.store.save_question(question)
        self.questions[question.id] = question
        if question.status == QuestionStatus.PENDING:
            self._pending[question.id] = question
        else:
            self._pending.pop(question.id, None)
        return question

    # -- asking ------------------------------------------------------------------------------

    def ask(self, agent: Agent, ask: base.Ask) -> Question:
        for open_q in self.pending_for(agent.id):
            if open_q.key == ask.key or _repeated(open_q, ask):
                return open_q  # the same question seen again (e.g. re-read after a restart)
        number = self.store.next_counter("question")
        question = self._save(
            Question(
                id=f"q-{number}",
                agent_id=agent.id,
                task_id=agent.task_id,
                type=ask.type,
                question=ask.question,
                options=list(ask.options),
                key=ask.key,
                meta=dict(ask.meta),
            )
        )
        self._set_waiting(agent.id, waiting=True)
        self.bus.publish(
            "agent.question",
            {
                "questionId": question.id,
                "agentId": agent.id,
                "taskId": agent.task_id,
                "type": question.type,
                "question": question.question,
                "options": question.options,
            },
        )
        return question

    # -- answering ------------------------------------------------------------------------------

    def answer(
        self, question_id: str, response: str, *, deliver: Callable[[Question, str], None]
    ) -> Question:
        question = self.get(question_id)
        if question.status != QuestionStatus.PENDING:
            raise Conflict(
                f"question {question_id} is already {question.status.value}",
                code=f"question_{question.status.value}",
                details={"status": question.status.value, "closedReason": question.closed_reason},
            )
        response = offered_option(question, response)
        deliver(question, response)
        answered = self._save(
            question.model_copy(
                update={
                    "status": QuestionStatus.ANSWERED,
                    "answer": response,
                    "answered_at": utcnow(),
                }
            )
        )
        if not self.pending_for(question.agent_id):
            self._set_waiting(question.agent_id, waiting=False)
        self.bus.publish(
            "question.answered",
            {"questionId": question.id, "agentId": question.agent_id, "taskId": question.task_id},
        )
        return answered

    def close_for_agent(self, agent_id: str, reason: str) -> None:
        for question in self.pending_for(agent_id):
            self._save(
                question.model_copy(
                    update={"status": QuestionStatus.CLOSED, "closed_reason": reason}
                )
            )
            self.bus.publish(
                "question.closed",
                {"questionId": question.id, "agentId": agent_id, "reason": reason},
            )
        self._set_waiting(agent_id, waiting=False)

    def _set_waiting(self, agent_id: str, *, waiting: bool) -> None:
        agent = self.state.agents.get(agent_id)
        if agent is None:
            return
        since = utcnow() if waiting else None
        if waiting and agent.status == AgentStatus.RUNNING:
            move_agent(
                self.state,
                agent_id,
                AgentStatus.WAITING,
                reason="asked a human",
                waiting_since=since,
            )
        elif not waiting and agent.status == AgentStatus.WAITING:
            move_agent(
                self.state, agent_id, AgentStatus.RUNNING, reason="answered", waiting_since=None
            )
        elif not waiting and agent.waiting_since is not None:
            # Already exited (or stopping): it no longer waits, whatever its status says.
            self.state.update_agent(agent_id, waiting_since=None)
        task = self.state.tasks.get(agent.task_id)
        if task is not None and (task.waiting_since is None) == waiting:
            self.state.update_task(task.id, waiting_since=since)
            self.state.flush()


def _repeated(question: Question, ask: base.Ask) -> bool:
    """A heartbeat question (no protocol meta) beaten again while it waits: the heartbeat
    contract allows the repeats, and after a restart the new adapter's keys start over."""
    return (
        not ask.meta
        and not question.meta
        and (question.type, question.question, question.options)
        == (ask.type, ask.question, list(ask.options))
    )


def offered_option(question: Question, response: str) -> str:
    """The option ``response`` names: the option itself, the same in another case, or one of
    the adapter's ``aliases`` for it (the key an interactive CLI reads, ``y`` for ``yes``).
    Any text when the question takes free text or offers no options; else 422."""
    if not question.options or response in question.options:
        return response
    word = response.strip().lower()
    for option in question.options:
        if option.lower() == word:
            return option
    aliases = question.meta.get("aliases")
    if isinstance(aliases, dict):
        alias = next((v for k, v in aliases.items() if str(k).lower() == word), None)
        if isinstance(alias, str) and alias in question.options:
            return alias
    if question.meta.get("free_text"):
        return response
    raise ValidationFailed(
        f"{response[:80]!r} is not one of the offered options: {', '.join(question.options)}",
        code="option_not_offered",
        details={"options": question.options},
    )
