"""Spelling: the known name a mistyped one was most likely meant to be ("did you mean").

One helper for every place a person types a name gridd checks: event types, config keys,
``gridctl`` options and plan fields. It is only called on a mistake, so difflib is imported
then.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` was most likely meant to be, if any is close."""
    import difflib  # only on a mistake

    matches = difflib.get_close_matches(name, sorted(set(known)), n=1)
    return matches[0] if matches else None


def did_you_mean(name: str, known: Iterable[str], *, quote: str = "'") -> str:
    """``"; did you mean 'x'?"`` for the closest known name, or ``""`` when none is close."""
    guess = closest(name, known)
    return f"; did you mean {quote}{guess}{quote}?" if guess else ""
