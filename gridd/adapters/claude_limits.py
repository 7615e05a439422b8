"""Claude Code's rate-limit and retry signals, read from its structured output first.

What the real CLI (2.1.x) prints, and what each becomes (REFERENCE.md §3):

    rate_limit_event {"rate_limit_info": {"status": "rejected", "resetsAt": <epoch s>,
                      "rateLimitType": "five_hour" | "seven_day" | "seven_day_opus" |
                      "seven_day_sonnet" | ...}}            remembered for the turn's result
    system/api_retry {"attempt", "max_retries", "retry_delay_ms", "error_status",
                      "error"}                               Retrying (the agent is alive)
    result {"is_error": true, "api_error_status": 429}      RateLimited: the reset from the
                      turn's rejected rate_limit_event (source ``rate_limit_event``), else
                      now + the last 429 retry's delay (the API key's ``retry-after``,
                      source ``retry-after``), else the reset the prose names (``message``),
                      else none (the scheduler's bounded backoff)
    result {"api_error_status": 529}                        RateLimited("overloaded"),
                      no reset: backoff
    result {"is_error": true} with a known limit notice    RateLimited from the prose
                      (the fallback: the text is rounded to the minute)

One ``RateLimited`` per turn at most: the ``assistant`` text that repeats the notice is
not read for limits, so one limit is never reported twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TypeGuard

from gridd.adapters.base import RateLimited, Retrying
from gridd.adapters.ratelimit import detect_rate_limit, parse_timestamp

RATE_LIMITED = 429
OVERLOADED = 529


@dataclass(frozen=True)
class LimitInfo:
    status: str
    resets_at: float | None
    limit_type: str | None


def limit_info(obj: dict[str, Any]) -> LimitInfo | None:
    """The ``rate_limit_info`` of a ``rate_limit_event`` line, or None when unusable."""
    info = obj.get("rate_limit_info")
    if not isinstance(info, dict):
        return None
    status = info.get("status")
    kind = info.get("rateLimitType")
    return LimitInfo(
        status=status if isinstance(status, str) else "",
        resets_at=parse_timestamp(info.get("resetsAt")),
        limit_type=kind if isinstance(kind, str) and kind else None,
    )


def retrying(obj: dict[str, Any]) -> Retrying:
    """A ``system/api_retry`` line as a ``Retrying`` signal (missing fields tolerated)."""
    attempt = obj.get("attempt")
    most = obj.get("max_retries")
    delay_ms = obj.get("retry_delay_ms")
    status = obj.get("error_status")
    error = obj.get("error")
    return Retrying(
        attempt=attempt if _int(attempt) else 0,
        max_retries=most if _int(most) else None,
        delay=float(delay_ms) / 1000 if _number(delay_ms) and delay_ms >= 0 else 0.0,
        error=str(error) if error is not None else "",
        status=status if _int(status) else None,
    )


def turn_limit(
    result: dict[str, Any],
    text: str,
    *,
    event: LimitInfo | None,
    retry_delay: float | None,
    now: float | None = None,
) -> RateLimited | None:
    """What a ``result`` line says about rate limits, given the turn's rejected
    ``rate_limit_event`` (``event``) and the delay of its last 429 retry."""
    now = time.time() if now is None else now
    status = result.get("api_error_status")
    failed = result.get("is_error") is True or result.get("subtype") != "success"
    message = text or f"API error {status}"
    if status == OVERLOADED:
        return RateLimited(message, None, limit_type="overloaded", source="none")
    if event is not None and (status == RATE_LIMITED or failed):
        if event.resets_at is not None and event.resets_at > now:
            return RateLimited(
                message, event.resets_at, limit_type=event.limit_type, source="rate_limit_event"
            )
        return RateLimited(message, None, limit_type=event.limit_type, source="none")
    prose = detect_rate_limit(text, now=now) if failed and text else None
    if status == RATE_LIMITED:
        if retry_delay is not None and retry_delay > 0:
            return RateLimited(
                message, now + retry_delay, limit_type="api_key", source="retry-after"
            )
        if prose is not None and prose.resets_at is not None:
            return RateLimited(message, prose.resets_at, limit_type=None, source="message")
        return RateLimited(message, None, limit_type="api_key", source="none")
    if prose is not None:
        source = "message" if prose.resets_at is not None else "none"
        return RateLimited(prose.message, prose.resets_at, limit_type=None, source=source)
    return None


def _int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
