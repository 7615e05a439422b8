"""Recognising a provider's usage-limit notice, conservatively.

Only a whole line that is exactly one of the known phrasings counts; anything else, however
limit-like, is ordinary output. The phrasings are the ones Claude Code prints, as reported
verbatim in its issue tracker:

- ``Claude AI usage limit reached|1755615600`` (epoch seconds after the bar)
  anthropics/claude-code#6119, #9046, #11429
- ``Claude usage limit reached. Your limit will reset at 5pm (Europe/Warsaw).``
  anthropics/claude-code#6119, #1328
- ``5-hour limit reached ∙ resets 12pm``  anthropics/claude-code#7641, #7892, #6392
- ``You've hit your limit · resets 1pm (Europe/Lisbon)``  (``claude -p``, exit 1)
  slopus/happy#465, anthropics/claude-code#31916; ``- resets Feb 7, 11am (Asia/Seoul)``
  in #22976; ``You've hit your session limit · resets 12:50am (...)`` in #74079

``resets_at`` is filled when the reset time can be read: an epoch directly, a wall-clock
time ("3pm", "12:50am", "Feb 7, 11am") as its next occurrence after ``now`` in the named
time zone (or local time when none is named).
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

from gridd.adapters.base import RateLimited

_EPOCH = re.compile(r"Claude AI usage limit reached\|(?P<epoch>\d{9,11})")
_PHRASES = (
    re.compile(r"Claude usage limit reached\. Your limit will reset at (?P<when>[^.]+)\.?"),
    re.compile(r"5-hour limit reached [∙·] resets (?P<when>.+)"),
    re.compile(r"You've hit your (?:session |weekly )?limit [∙·-] resets (?P<when>.+)"),
)
_WHEN = re.compile(
    r"(?:(?P<month>[A-Z][a-z]{2}) (?P<day>\d{1,2}), )?"
    r"(?:at )?(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))? ?(?P<ampm>am|pm)"
    r"(?: \((?P<zone>[A-Za-z_+\-/0-9]+)\))?",
    re.IGNORECASE,
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
MAX_LINE = 400  # the notices are short; longer lines are never notices


#: Every notice below contains it; text without it is rejected before any regex runs.
LIMIT_WORD = "limit"


def detect_rate_limit(line: str, *, now: float | None = None) -> RateLimited | None:
    """A ``RateLimited`` when ``line`` is exactly a known usage-limit notice, else None."""
    if LIMIT_WORD not in line:
        return None
    text = line.strip()
    if not text or len(text) > MAX_LINE:
        return None
    match = _EPOCH.fullmatch(text)
    if match:
        return RateLimited(message=text, resets_at=float(match["epoch"]))
    for phrase in _PHRASES:
        match = phrase.fullmatch(text)
        if match:
            when = parse_reset_time(match["when"], now=time.time() if now is None else now)
            return RateLimited(message=text, resets_at=when)
    return None


def parse_reset_time(text: str, *, now: float) -> float | None:
    """Epoch seconds of the next "3pm (Zone/Name)"-style moment after ``now``, or None."""
    match = _WHEN.fullmatch(text.strip())
    if not match:
        return None
    hour, minute = int(match["hour"]), int(match["minute"] or 0)
    if not 1 <= hour <= 12 or minute > 59:
        return None
    hour = hour % 12 + (12 if match["ampm"].lower() == "pm" else 0)
    zone: tzinfo | None = None
    if match["zone"]:
        try:
            zone = ZoneInfo(match["zone"])
        except (ValueError, KeyError, OSError):
            return None
    current = datetime.fromtimestamp(now, tz=zone).astimezone(zone)
    if match["month"]:
        month = match["month"].lower()
        if month not in _MONTHS:
            return None
        try:
            moment = current.replace(
                month=_MONTHS.index(month) + 1,
                day=int(match["day"]),
                hour=hour,
                minute=minute,
                second=0,
                microsecond=0,
            )
        except ValueError:
            return None
        if moment < current - timedelta(days=1):  # "Jan 2" seen on Dec 30 means next year
            moment = moment.replace(year=moment.year + 1)
        return moment.timestamp()
    moment = current.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if moment <= current:
        moment += timedelta(days=1)
    return moment.timestamp()


def parse_timestamp(value: object) -> float | None:
    """Epoch seconds from a number (seconds or milliseconds) or an ISO 8601 string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            return None
        return seconds / 1000 if seconds > 1e11 else seconds  # milliseconds since 1973
    if isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            return parse_timestamp(float(text))
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    return None
