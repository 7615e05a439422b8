"""A lean daemon process: what the daemon never uses is not loaded, nor collected over.

- **pydantic plugins.** On the first model it builds, pydantic looks for plugins: it imports
  ``importlib.metadata`` (and with it ``email``, ``zipfile``, ``csv``) and reads the entry
  points of every installed distribution. gridd uses no pydantic plugin, and the search was
  ~15 ms of every start and 1.4 MB of every idle daemon. The daemon runs with none: the
  effect of ``PYDANTIC_DISABLE_PLUGINS=__all__``, without putting that variable into the
  environment every agent inherits. Called by ``gridd``'s entry point before the daemon's
  first pydantic model.

- **the start's objects are frozen once the daemon serves.** Importing gridd builds tens
  of thousands of long-lived objects (classes, functions, validators) that the cycle
  collector would otherwise walk on every full collection for the daemon's whole life.
  Once the socket answers (``freeze_after_start``), a moment later, the start's garbage is
  collected and everything left is moved out of the collector's sight with
  ``gc.freeze()``. The collector itself is never paused: a start that hangs collects as
  any Python process does.

- **a big request's objects are frozen as it builds them.** A 50,000-task ``POST /tasks``
  adds about two million objects to the heap (specs, tasks, their rows and events). The
  collector runs a full collection each time the heap has grown by a quarter, and each walks
  everything not frozen: measured, a dozen of them took 2.3 s in all, the longest 670 ms,
  every one holding the interpreter (the event loop included, whichever thread set it off).
  The request's chunked steps go through ``BulkPace``: a turn of the loop between chunks,
  and every ``FREEZE_EVERY_ITEMS`` items what was built is collected and frozen, so no
  collection walks more than a few thousand items' worth. (Frozen objects are still freed
  when the last reference goes: tasks and specs hold no cycles.)
"""

from __future__ import annotations

import asyncio
import gc
import sys
import types
from collections.abc import Iterable
from typing import Any

#: pydantic's plugin loader (private, but stable across pydantic 2.x); imported by pydantic
#: only from inside the function that builds a validator, so a module put here first wins.
PYDANTIC_PLUGIN_LOADER = "pydantic.plugin._loader"


def _no_plugins() -> Iterable[Any]:
    return ()


def without_pydantic_plugins() -> bool:
    """Make pydantic build every validator with no plugins, without its plugin search.
    False (and no effect) when pydantic has already loaded its loader."""
    if PYDANTIC_PLUGIN_LOADER in sys.modules:
        return False
    loader = types.ModuleType(PYDANTIC_PLUGIN_LOADER, "gridd runs pydantic with no plugins")
    loader.get_plugins = _no_plugins  # type: ignore[attr-defined]
    sys.modules[PYDANTIC_PLUGIN_LOADER] = loader
    return True


#: Seconds after the daemon serves when the start's leftovers are collected and the rest
#: frozen: not at once, where a full collection would hold up the first requests.
FREEZE_AFTER_START = 1.0


def collect_and_freeze() -> None:
    """Collect the garbage there is, then move every object left out of the collector's
    sight (``gc.freeze``): later collections walk only what was made since."""
    gc.collect()
    gc.freeze()


def freeze_after_start() -> None:
    """The daemon serves: collect and freeze the start's objects a moment later (called on
    the event loop)."""
    asyncio.get_running_loop().call_later(FREEZE_AFTER_START, collect_and_freeze)


#: A big request's new objects are collected and frozen each time it has built this many
#: items (``BulkPace``): a collection then walks about 50,000 objects, a few milliseconds.
FREEZE_EVERY_ITEMS = 2_000


class BulkPace:
    """The pace of one big request's chunked work: ``await pace.step(n)`` after each chunk
    of ``n`` items gives the event loop a turn, and every ``FREEZE_EVERY_ITEMS`` items
    collects and freezes what was built so far (``collect_and_freeze``)."""

    def __init__(self) -> None:
        self._unfrozen = 0

    async def step(self, items: int) -> None:
        self._unfrozen += items
        if self._unfrozen >= FREEZE_EVERY_ITEMS:
            self._unfrozen = 0
            collect_and_freeze()
        await asyncio.sleep(0)
