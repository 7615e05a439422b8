"""Talking to a running agent: answers to its questions, follow-ups, nudges.

Everything goes to the agent's stdin through its handle, encoded the way its adapter's
protocol expects. Something the agent is told counts as life: its stall clock starts anew.
"""

from __future__ import annotations

import time
from pathlib import Path

from gridd.adapters import base
from gridd.errors import Conflict, GriddError
from gridd.model import Agent, Question
from gridd.pool.context import PoolContext
from gridd.runs.output import OutputLog
from gridd.runs.watch import RunWatch


class Conversation:
    def __init__(self, ctx: PoolContext) -> None:
        self.ctx = ctx

    def write_stdin(self, agent_id: str, text: str) -> None:
        handle = self.ctx.roster.handles.get(agent_id)
        if handle is None:
            raise Conflict(f"agent {agent_id!r} is not running", code="agent_not_running")
        handle.write_stdin(text)

    def deliver_answer(self, question: Question, response: str) -> None:
        """Encode an answer the way this agent's protocol expects, and write it."""
        roster = self.ctx.roster
        run = roster.runs.get(question.agent_id)
        if run is None or question.agent_id not in roster.handles:
            raise Conflict(
                f"agent {question.agent_id} is no longer running; the question cannot be answered",
                code="agent_not_running",
            )
        ask = base.Ask(
            key=question.key,
            type=question.type,
            question=question.question,
            options=list(question.options),
            meta=dict(question.meta),
        )
        self.write_stdin(question.agent_id, run.adapter.encode_answer(ask, response))
        # Its silence while it waited for a human is not a stall: the clock starts again now.
        run.last_life = time.monotonic()

    def follow_up(self, agent_id: str, text: str) -> None:
        """Tell a working agent ``text`` unasked (``respond`` with no question pending)."""
        run = self.ctx.roster.runs.get(agent_id)
        if run is None or agent_id not in self.ctx.roster.handles:
            raise Conflict(f"agent {agent_id!r} is not running", code="agent_not_running")
        if run.session_ended:
            raise Conflict(
                f"agent {agent_id!r} has finished its conversation and is exiting",
                code="agent_finishing",
            )
        line = run.adapter.encode_follow_up(text)
        if line is None:
            raise Conflict(
                f"agent {agent_id!r} has no pending question and takes no other message",
                code="no_pending_question",
            )
        self.write_stdin(agent_id, line)
        run.last_life = time.monotonic()

    def nudge(self, agent_id: str, run: RunWatch, text: str, *, why: str) -> bool:
        """Send ``text`` as a follow-up to wake the agent (once per run for a stall)."""
        run.nudged = True
        bus = self.ctx.bus
        try:
            self.follow_up(agent_id, text)
        except GriddError as exc:
            bus.publish(
                "agent.warning",
                {"agentId": agent_id, "warning": f"could not nudge it after {why}: {exc.message}"},
            )
            return False
        agent = self.ctx.state.agents[agent_id]
        bus.publish(
            "agent.nudged",
            {"agentId": agent_id, "taskId": agent.task_id, "reason": why, "text": text},
        )
        return True


def output_log(agent: Agent) -> OutputLog:
    """The agent's output, for reading (``GET /agents/{id}/output``, failure tails)."""
    return OutputLog(Path(agent.run_dir), writer=False)
