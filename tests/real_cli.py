"""What the real-CLI tests (Claude Code, Codex, ...) share: the newest agent of a task, the
argv a run was started with, and wall-clock times read back from the API."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from gridd.client import GridClient

ROOT = Path(__file__).resolve().parent.parent


def agent_of(c: GridClient, task_id: str) -> dict[str, Any]:
    """The task's newest agent run, exited or not."""
    agents = [a for a in c.get("/agents", params={"all": "1"}) if a["taskId"] == task_id]
    return agents[-1]  # type: ignore[no-any-return]


def spec_argv(agent: dict[str, Any]) -> list[str]:
    """The argv the run was started with (its run directory's spec.json)."""
    spec = json.loads((Path(agent["runDir"]) / "spec.json").read_text())
    return [str(a) for a in spec["argv"]]


def epoch(value: str) -> float:
    """Epoch seconds of an API timestamp."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
