"""How ``gridctl`` shows events: compact JSON, or one line for people."""

from __future__ import annotations

import json
from typing import Any

from gridd.client import SSEEvent


def event_json(event: SSEEvent) -> str:
    """One event as compact JSON: ``{"id":..,"type":..,"data":..}``."""
    return json.dumps(event.as_dict(), separators=(",", ":"), default=str)


def _value(value: Any) -> str:
    if isinstance(value, str):
        return (
            value
            if value and not any(c.isspace() or c in "\"'=" for c in value)
            else json.dumps(value)
        )
    return json.dumps(value, separators=(",", ":"), default=str)


def event_pretty(event: SSEEvent) -> str:
    """One event for people: ``#12 agent.spawned agentId=a1 taskId=t1``."""
    head = f"#{event.id if event.id is not None else '-'} {event.type}"
    if isinstance(event.data, dict):
        pairs = " ".join(f"{key}={_value(value)}" for key, value in event.data.items())
    else:
        pairs = _value(event.data)
    return f"{head} {pairs}".rstrip()
