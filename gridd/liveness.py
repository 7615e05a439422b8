"""PURE: is an agent alive, stalled or never launched? (wakecycle's LAUNCH-FAIL/stalled)

Life is any output or heartbeat. No life at all within ``launch_grace`` of the start is a
launch failure (the command probably cannot run: auth, PATH, a typo); silence longer than
``stall`` after some life is a (recoverable) stall; longer than ``stall_kill`` gets the agent
killed and retried. All times are monotonic seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    OK = "ok"
    LAUNCH_FAILED = "launch_failed"
    STALLED = "stalled"
    STALL_KILL = "stall_kill"


@dataclass(frozen=True)
class Limits:
    launch_grace: float | None
    stall: float | None
    stall_kill: float | None


def assess(*, now: float, started: float, last_life: float | None, limits: Limits) -> Verdict:
    if last_life is None:
        if limits.launch_grace is not None and now - started > limits.launch_grace:
            return Verdict.LAUNCH_FAILED
        return Verdict.OK
    silent = now - last_life
    if limits.stall_kill is not None and silent > limits.stall_kill:
        return Verdict.STALL_KILL
    if limits.stall is not None and silent > limits.stall:
        return Verdict.STALLED
    return Verdict.OK


def next_change(
    *, now: float, started: float, last_life: float | None, limits: Limits
) -> float | None:
    """Seconds until ``assess`` could give another verdict if the agent stays silent (None:
    never). A monitor that sleeps until then misses no launch failure, stall or stall kill."""
    if last_life is None:
        marks = [started + limits.launch_grace] if limits.launch_grace is not None else []
    else:
        marks = [last_life + t for t in (limits.stall, limits.stall_kill) if t is not None]
    ahead = [m - now for m in marks if m >= now]
    # Just past the mark: assess compares with ">".
    return min(ahead) + 0.01 if ahead else None


LAUNCH_HINT = (
    "no output and no heartbeat within the launch grace: check that the command exists and"
    " is on PATH, that it is authenticated (API key, login), and the profile's argv"
)
