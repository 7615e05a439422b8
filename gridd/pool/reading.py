"""Reading a run: what an agent's new output and heartbeats mean, put into state and events.

A monitor (``monitoring.py``) polls the run (``runs/watch.py``) and hands each ``Poll`` here:
output chunks become ``agent.output`` events (committed together with the agent's published
position), heartbeats and the adapter's signals (activity, questions, cost, session id,
result, rate limit, retries, nudges, usage, model, tool use) update the agent and publish
their events. Questions go to the question book, or are answered by the adapter itself.
"""

from __future__ import annotations

from contextlib import nullcontext

from gridd.adapters import base
from gridd.errors import GriddError
from gridd.model import Agent, utcnow
from gridd.pool.context import PoolContext
from gridd.pool.stopping import Stopper
from gridd.pool.talking import Conversation
from gridd.runs.watch import Poll, RunWatch
from gridd.store import last_line


class RunReader:
    def __init__(self, ctx: PoolContext, *, talk: Conversation, stopper: Stopper) -> None:
        self.ctx = ctx
        self.talk = talk
        self.stopper = stopper

    def apply(self, agent_id: str, run: RunWatch, polled: Poll) -> None:
        """Publish one look at one run: its output in a transaction of its own, then the
        rest (``apply_rest``). The output pass (``batching.py``) publishes many runs' output
        in one transaction instead; a monitor reading what an exited run left uses this.
        A store that refuses the output keeps the look (``RunWatch.hold``) and raises."""
        if polled.chunks:
            try:
                with self.ctx.state.store.transaction():
                    self.publish_output([(agent_id, polled)])
            except BaseException:
                run.hold(polled)
                raise
        self.apply_rest(agent_id, run, polled)

    def publish_output(self, looked: list[tuple[str, Poll]]) -> None:
        """Inside the caller's transaction: every look's chunks as ``agent.output`` events
        and each agent's new published position. They commit together, so a daemon killed
        after indexing them publishes exactly the rest on restart. (Subscribers see the
        events only once the transaction has committed.)"""
        agents = self.ctx.state.agents
        datas: list[dict[str, object]] = []
        positions: list[tuple[str, int, str]] = []
        for agent_id, polled in looked:
            if not polled.chunks:
                continue
            for chunk in polled.chunks:
                datas.append({"agentId": agent_id, "chunk": chunk.text, "seq": chunk.seq})
            last = last_line(polled.chunks[-1].text)
            positions.append(
                (agent_id, polled.chunks[-1].seq, last or agents[agent_id].last_output)
            )
        if positions:
            self.ctx.bus.publish_many("agent.output", datas)
            self.ctx.state.note_output(positions)

    def apply_rest(self, agent_id: str, run: RunWatch, polled: Poll) -> None:
        """What a look means besides its output: heartbeats, warnings, the adapter's
        signals, a stall recovered; persisted and published one by one."""
        agent = self.ctx.state.agents[agent_id]
        changes: dict[str, object] = {}
        if polled.beats:
            beat = polled.beats[-1]
            changes.update(
                last_heartbeat=utcnow(),
                heartbeat_offset=run.heartbeats.offset,
                activity=beat.label or beat.status,
                message=beat.message,
            )
        for warning in polled.warnings:
            self.ctx.bus.publish("agent.warning", {"agentId": agent_id, "warning": warning})
        if polled.denials:
            self._denied(agent_id, run, polled)
        for sig in polled.signals:
            self._signal(agent, run, sig, changes)
        if polled.life and agent.stalled:
            changes["stalled"] = False
            self.ctx.bus.publish("agent.recovered", {"agentId": agent_id, "taskId": agent.task_id})
        if changes:
            # Heartbeats, costs and session ids are persisted; output position is derivable.
            persist = bool(polled.beats) or any(
                k in changes for k in ("cost_usd", "session_id", "result", "stalled", "model")
            )
            self.ctx.state.update_agent(agent_id, persist=persist, **changes)
        if run.adapter.ends_on_result and not run.session_ended and run.adapter.idle():
            self.stopper.end_conversation(agent_id, run)

    def _denied(self, agent_id: str, run: RunWatch, polled: Poll) -> None:
        """What the kernel refused the run (the shim's ``denied.ndjson``): each line through
        the run's rate limit (the proxy's too, ``egress.DenialLimit``), published as
        ``agent.sandbox_denied`` in the transaction that records how far the file is read
        (``denied_offset``): a restarted daemon publishes exactly the rest."""
        limit = self.ctx.egress.limit
        store = self.ctx.state.store
        try:
            with nullcontext() if store.in_transaction else store.transaction():
                for denial in polled.denials:
                    said = limit.take(agent_id, unreported=denial.unreported)
                    if said is not None:
                        self.ctx.sandbox_denied(agent_id, denial.kind, denial.target, said)
                self.ctx.state.update_agent(agent_id, denied_offset=run.denied.offset)
        except BaseException:
            # Not recorded (a full disk): read again from what was, next time.
            run.denied.offset = self.ctx.state.agents[agent_id].denied_offset
            raise

    def _signal(
        self, agent: Agent, run: RunWatch, sig: base.Signal, changes: dict[str, object]
    ) -> None:
        if isinstance(sig, base.Activity):
            changes.update(activity=sig.label, message=sig.message)
        elif isinstance(sig, base.Ask):
            auto = run.adapter.auto_answer(sig)
            line: str | None = None
            if auto is not None:
                try:
                    # Encoded like a human's answer: aider reads "y", not the label "yes".
                    line = run.adapter.encode_answer(sig, auto)
                    self.ctx.roster.handles[agent.id].write_stdin(line)
                except GriddError as exc:  # e.g. stdin = "null": a human must answer
                    line = None
                    warning = f"could not answer automatically ({exc.message}); asking a human"
                    self.ctx.bus.publish("agent.warning", {"agentId": agent.id, "warning": warning})
            if line is not None:
                self.ctx.bus.publish(
                    "agent.auto_answered",
                    {
                        "agentId": agent.id,
                        "taskId": agent.task_id,
                        "question": sig.question,
                        "answer": auto,
                    },
                )
            else:
                self.ctx.questions.ask(self.ctx.state.agents[agent.id], sig)
        elif isinstance(sig, base.Cost):
            changes["cost_usd"] = sig.usd
        elif isinstance(sig, base.SessionId):
            changes["session_id"] = sig.value
        elif isinstance(sig, base.Result):
            changes.update(result=sig.text[-2000:], current_tool=None)
        elif isinstance(sig, base.RateLimited):
            if not run.rate_limit_published:  # one event per park, however often it is said
                run.rate_limit_published = True
                self.ctx.bus.publish(
                    "agent.rate_limited",
                    {
                        "agentId": agent.id,
                        "taskId": agent.task_id,
                        "message": sig.message,
                        "resetsAt": sig.resets_at,
                        "limitType": sig.limit_type,
                        "source": sig.source,
                    },
                )
        elif isinstance(sig, base.Retrying):
            self.ctx.bus.publish(
                "agent.retrying",
                {
                    "agentId": agent.id,
                    "taskId": agent.task_id,
                    "attempt": sig.attempt,
                    "maxRetries": sig.max_retries,
                    "delaySeconds": sig.delay,
                    "error": sig.error,
                    "status": sig.status,
                },
            )
            changes.update(
                activity="retrying", message=f"{sig.error or 'API error'}, attempt {sig.attempt}"
            )
        elif isinstance(sig, base.Nudge):
            self.talk.nudge(agent.id, run, sig.text, why="a continue heartbeat")
        elif isinstance(sig, base.Usage):
            changes.update(input_tokens=sig.input_tokens, output_tokens=sig.output_tokens)
        elif isinstance(sig, base.ModelName):
            changes["model"] = sig.name
        elif isinstance(sig, base.ToolUse):
            changes["current_tool"] = (
                f"{sig.name}: {sig.summary}" if sig.name and sig.summary else sig.name
            )
        elif isinstance(sig, base.Malformed):
            self.ctx.bus.publish("agent.warning", {"agentId": agent.id, "warning": sig.message})
