"""A lean daemon process: third-party machinery the daemon never uses is not loaded.

Called by ``gridd``'s entry point before anything of the daemon is imported:

- **pydantic plugins.** On the first model it builds, pydantic looks for plugins: it imports
  ``importlib.metadata`` (and with it ``email``, ``zipfile``, ``csv``) and reads the entry
  points of every installed distribution. gridd uses no pydantic plugin, and the search was
  ~15 ms of every start and 1.4 MB of every idle daemon. The daemon runs with none: the
  effect of ``PYDANTIC_DISABLE_PLUGINS=__all__``, without putting that variable into the
  environment every agent inherits.

uvicorn's command line is kept out the same way, by ``gridd.api.uvicorn_core``.
"""

from __future__ import annotations

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
