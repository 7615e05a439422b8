"""What every part of the pool works with: settings, state, events, the executor, the roster.

Built once by ``AgentPool`` and handed to its parts (spawning, watching, reading, talking,
stopping), so each part names what it needs without a long constructor of its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gridd.background import Background
from gridd.diskfault import DiskFault
from gridd.events import EventBus
from gridd.liveness import Limits
from gridd.model import Agent
from gridd.pool.roster import Roster
from gridd.questions import QuestionBook
from gridd.runs.egress import EgressProxies
from gridd.runs.executor import Executor
from gridd.settings import AgentProfile, Settings
from gridd.state import GridState
from gridd.workspace import Workspace


@dataclass
class PoolContext:
    workspace: Workspace
    settings: Settings
    profiles: dict[str, AgentProfile]
    state: GridState
    bus: EventBus
    background: Background
    questions: QuestionBook
    executor: Executor
    roster: Roster
    #: Whether ``.grid/`` takes writes: a start failed by the disk is not the task's.
    disk: DiskFault
    #: The filtering proxies of the runs whose sandbox's network is ``allowlist``.
    egress: EgressProxies

    def limits(self, agent: Agent) -> Limits:
        """The agent's health limits: its profile's, else the scheduler's defaults."""
        sched = self.settings.scheduler
        profile = self.profiles.get(agent.profile)
        return Limits(
            launch_grace=(profile and profile.launch_grace_seconds) or sched.launch_grace_seconds,
            stall=(profile and profile.stall_seconds) or sched.stall_seconds,
            stall_kill=sched.stall_kill_seconds,
        )

    def sandbox_denied(self, agent_id: str, kind: str, target: str, unreported: int) -> None:
        """Publish a refusal of the run's sandbox (already let through its rate limit,
        ``egress.DenialLimit``): its proxy's (``kind`` ``network``) or its kernel's
        (``connect``, ``bind``, ``socket``: ``runs/refusals.py``)."""
        agent = self.state.agents.get(agent_id)
        self.bus.publish(
            "agent.sandbox_denied",
            {
                "agentId": agent_id,
                "taskId": agent.task_id if agent is not None else None,
                "kind": kind,
                "target": target,
                "unreported": unreported,
            },
        )

    def started(self, agent_id: str) -> float:
        """When the agent started (monotonic), as far as this daemon knows."""
        return self.roster.started_mono.get(agent_id, time.monotonic())
