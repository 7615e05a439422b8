"""Waiting for a condition: one ``wait_for`` (blocking) and one ``until`` (async).

Both poll a predicate until it returns something truthy, return that value, and fail
with an AssertionError naming what was awaited when the timeout passes.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, message: str = ""):  # type: ignore[no-untyped-def]
    """Poll ``predicate()`` until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)


async def until(
    predicate: Callable[[], Any] | Callable[[], Awaitable[Any]],
    *,
    timeout: float = 30.0,
    interval: float = 0.02,
    what: str = "",
) -> Any:
    """Poll ``predicate()`` (plain or async) on the running loop until it is truthy; its value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(interval)
