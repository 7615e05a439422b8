"""The agent pool: spawning, watching, talking to and stopping agents (see ``core.py``)."""

from __future__ import annotations

from gridd.pool.core import AgentPool
from gridd.pool.prompts import continuation_prompt, feedback_prompt, render_command
from gridd.pool.roster import Roster

__all__ = ["AgentPool", "Roster", "continuation_prompt", "feedback_prompt", "render_command"]
