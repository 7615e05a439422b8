"""uvicorn's server and HTTP protocol, without uvicorn's command line.

``import uvicorn`` (or of any ``uvicorn.*`` module) first runs ``uvicorn/__init__.py``,
which imports ``uvicorn.main``: click, and the reload and multiprocess supervisors
(watchfiles, multiprocessing). A daemon that passes its own socket to ``Server.serve`` uses
none of them, and they were a tenth of its start and a few MB of its memory.

So the ``uvicorn`` package module is created here without running its ``__init__``; the
submodules gridd uses (``config``, ``server``, ``importer``, the protocols) import as usual
beneath it. Whoever later asks the package for anything else (``uvicorn.run``,
``uvicorn.__version__``, ``from uvicorn import main``) gets the real ``__init__``, run then
into the same module: nothing else in the process sees a difference.

uvicorn is pinned to a minor version in pyproject.toml (gridd subclasses its internals);
``tests/test_lean_import.py`` proves the full package still loads on first use.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any


def _package_without_init() -> types.ModuleType:
    loaded = sys.modules.get("uvicorn")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("uvicorn")
    if spec is None or spec.loader is None:  # pragma: no cover - a broken install
        raise ImportError("uvicorn is not installed")
    loader = spec.loader
    package = importlib.util.module_from_spec(spec)

    def finish_loading(name: str) -> Any:
        # The real __init__, once, on the first name we did not set: it then defines
        # everything (and imports uvicorn.main) exactly as a plain ``import uvicorn`` does.
        del package.__getattr__
        loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = finish_loading  # type: ignore[method-assign]
    sys.modules["uvicorn"] = package
    return package


_uvicorn = _package_without_init()

from uvicorn.config import HTTP_PROTOCOLS, Config  # noqa: E402
from uvicorn.importer import import_from_string  # noqa: E402
from uvicorn.server import Server  # noqa: E402

if "Config" not in vars(_uvicorn):
    # ``uvicorn.lifespan.*`` do ``from uvicorn import Config``: that much of the package
    # namespace is served without loading the rest.
    _uvicorn.Config = Config  # type: ignore[attr-defined]


@contextlib.contextmanager
def without_uvicorn_cli() -> Iterator[None]:
    """Import a library that *optionally* patches ``uvicorn.main`` (sse-starlette wraps
    ``Server.handle_exit``, uvicorn's signal handler) as if uvicorn's CLI were absent.

    gridd never runs that handler: ``daemon._Server`` installs its own signal handling, and
    SSE streams end when the event bus closes. The patch would only cost the import."""
    if "uvicorn.main" in sys.modules:
        yield
        return
    sys.modules["uvicorn.main"] = None  # type: ignore[assignment]  # "import" raises ImportError
    try:
        yield
    finally:
        if sys.modules.get("uvicorn.main", 0) is None:
            del sys.modules["uvicorn.main"]


__all__ = ["HTTP_PROTOCOLS", "Config", "Server", "import_from_string", "without_uvicorn_cli"]
