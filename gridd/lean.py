"""A lean daemon process: third-party machinery the daemon never uses is not loaded.

Called by ``gridd``'s entry point before anything of the daemon is imported:

- **pydantic plugins.** On the first model it builds, pydantic looks for plugins: it imports
  ``importlib.metadata`` (and with it ``email``, ``zipfile``, ``csv``) and reads the entry
  points of every installed distribution. gridd uses no pydantic plugin, and the search was
  ~15 ms of every start and 1.4 MB of every idle daemon. The daemon runs with none: the
  effect of ``PYDANTIC_DISABLE_PLUGINS=__all__``, without putting that variable into the
  environment every agent inherits.

- **the cycle collector during the start.** Importing gridd builds tens of thousands of
  long-lived objects (classes, functions, validators); the collector ran ~100 times over
  them and found next to nothing: a tenth of the start's CPU. It is paused until the
  daemon serves (``gc_after_start``, called by the daemon once its socket answers), then
  is back as usual, with one full collection a second later.

uvicorn's command line is kept out the same way, by ``gridd.api.uvicorn_core``.
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


def pause_gc_until_serving() -> None:
    """Pause the cycle collector for the start (``gc_after_start`` resumes it)."""
    gc.disable()


#: Seconds after the daemon serves when the start's leftovers are collected: not at once,
#: where a full collection would hold up the first requests.
COLLECT_AFTER_START = 1.0


def gc_after_start() -> None:
    """The daemon serves: resume collecting, and collect what the start left behind a
    moment later (called on the event loop). Does nothing to a collector nobody paused (a
    daemon run another way, as tests do)."""
    if not gc.isenabled():
        gc.enable()
        asyncio.get_running_loop().call_later(COLLECT_AFTER_START, gc.collect)
