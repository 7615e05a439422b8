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

- **OpenSSL until something uses it.** ``asyncio`` imports ``ssl``, and Starlette and
  gridd import ``hashlib`` and ``secrets`` (which imports ``hmac``): each loads the OpenSSL
  library (``libcrypto``, and ``libssl`` for ``ssl``), 4.5 MB of an idle daemon's memory,
  for what a daemon serving a Unix socket seldom does: a webhook over https, a sha256 of
  a committed config. ``defer_openssl`` puts those modules in ``sys.modules`` deferred:
  each runs its real code on the first use of a name it does not hold, so
  ``import ssl`` costs nothing and ``ssl.create_default_context()`` works as ever.

uvicorn's command line is kept out the same way, by ``gridd.api.uvicorn_core``.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Iterable, Mapping
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
        import asyncio

        asyncio.get_running_loop().call_later(COLLECT_AFTER_START, gc.collect)


class DeferredModule:
    """A module put into ``sys.modules`` without running its code (``deferred_module``)."""

    def __init__(
        self,
        name: str,
        preset: Mapping[str, Any],
        on_load: Callable[[types.ModuleType], None] | None,
    ) -> None:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:  # pragma: no cover - a broken Python
            raise ImportError(f"no module named {name!r}")
        self.spec, self.loader = spec, spec.loader
        self.module = importlib.util.module_from_spec(spec)
        self.module.__dict__.update(preset)
        self.module.__getattr__ = self._getattr  # type: ignore[method-assign]
        self.on_load = on_load
        self.loaded = False
        self._lock = threading.RLock()
        self._loading = False

    def load(self) -> types.ModuleType:
        """Run the module's code, once. A thread asking for a name the module does not hold
        yet waits until it has run; as with any import, a name it already holds is read
        at once, so another thread holding the module may see it partly run."""
        with self._lock:
            if not self.loaded and not self._loading:
                self._loading = True
                try:
                    self.loader.exec_module(self.module)
                    if vars(self.module).get("__getattr__") == self._getattr:
                        del self.module.__getattr__
                    self.loaded = True
                    if self.on_load is not None:
                        self.on_load(self.module)
                finally:
                    self._loading = False
        return self.module

    def _getattr(self, attr: str) -> Any:
        # Module __getattr__ (PEP 562): asked only for a name the module does not hold.
        if attr == "__path__" and self.spec.submodule_search_locations is None:
            # Asked by every ``from <module> import <name>``: a plain module has none, and
            # saying so needs none of its code.
            raise AttributeError(attr)
        self.load()
        if not self.loaded:  # asked by the module's own code while it runs
            raise AttributeError(f"partially initialized module {self.module.__name__!r}")
        return getattr(self.module, attr)


class DeferredClass:
    """Stands for the class ``<module>.<name>`` of a deferred module until it loads, for
    code that takes the class at import (``from ssl import SSLContext``) and no more.

    Before the load no instance can exist, so an ``isinstance`` check is False without
    loading anything, and it can go into a type annotation (``Optional[SSLContext]``).
    Calling it, subclassing it or asking it for an attribute loads the module and acts on
    the real class; the load then puts the real class in place of this stand-in wherever a
    module holds it."""

    #: What ``typing`` asks of a type put into an annotation: a plain (not generic) class
    #: has none of these, so saying so needs no load.
    NOT_ON_A_PLAIN_CLASS = frozenset(
        {
            "__origin__",
            "__args__",
            "__parameters__",
            "__typing_subst__",
            "__typing_unpacked_tuple_args__",
            "__typing_is_unpacked_typevartuple__",
        }
    )

    def __init__(self, deferred: DeferredModule, name: str) -> None:
        self._deferred, self._name = deferred, name

    def real(self) -> Any:
        return vars(self._deferred.load())[self._name]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.real()(*args, **kwargs)

    def __instancecheck__(self, obj: object) -> bool:
        return self._deferred.loaded and isinstance(obj, self.real())

    def __subclasscheck__(self, cls: type) -> bool:
        return self._deferred.loaded and issubclass(cls, self.real())

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (self.real(),)

    def __or__(self, other: Any) -> Any:
        return self.real() | other

    def __ror__(self, other: Any) -> Any:
        return other | self.real()

    def __getattr__(self, attr: str) -> Any:
        if attr in self.NOT_ON_A_PLAIN_CLASS:
            raise AttributeError(attr)
        return getattr(self.real(), attr)

    def __repr__(self) -> str:
        return f"<deferred class {self._deferred.module.__name__}.{self._name}>"


def deferred_module(
    name: str,
    *,
    preset: Mapping[str, Any] | None = None,
    classes: Iterable[str] = (),
    on_load: Callable[[types.ModuleType], None] | None = None,
) -> types.ModuleType:
    """Put the module ``name`` into ``sys.modules`` without running its code; the code runs,
    into that same module object, on the first use of a name it does not hold.

    ``preset`` names (constants) and ``classes`` (``DeferredClass`` stand-ins) are held
    before, and the real ones replace them then. ``on_load(module)`` runs right after.
    Returns the module already imported, unchanged, if there is one."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    deferred = DeferredModule(name, preset or {}, None)
    stand_ins = {cls: DeferredClass(deferred, cls) for cls in classes}
    deferred.module.__dict__.update(stand_ins)

    def finish(module: types.ModuleType) -> None:
        if on_load is not None:
            on_load(module)
        if stand_ins:
            _replace_everywhere({id(s): vars(module)[n] for n, s in stand_ins.items()})

    deferred.on_load = finish
    sys.modules[name] = deferred.module
    return deferred.module


def _replace_everywhere(real_by_id: Mapping[int, Any]) -> None:
    """Rebind every module global that holds a stand-in to what it stands for."""
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        # Read past the module's own attribute hooks: a lazily loaded module (importlib's
        # LazyLoader) would otherwise be loaded by being looked at.
        namespace = object.__getattribute__(module, "__dict__")
        for key, value in list(namespace.items()):
            if id(value) in real_by_id:
                namespace[key] = real_by_id[id(value)]


#: asyncio's modules that bind ``ssl`` at import (the same in CPython 3.11 to 3.13).
_ASYNCIO_WITH_SSL = ("asyncio.base_events", "asyncio.selector_events", "asyncio.sslproto")

#: Constants read from ``ssl`` at import, as default argument values, by uvicorn's ``config``
#: (at start) and prometheus_client's exposition (the first ``GET /metrics``), for TLS that
#: gridd never uses. ``tests/test_openssl_deferred.py`` holds them equal to the real ones.
SSL_PRESET = {"PROTOCOL_TLS_SERVER": 17, "PROTOCOL_TLS_CLIENT": 16, "CERT_NONE": 0}

#: Classes taken from ``ssl`` at import for annotations, by anyio's TLS streams (loaded by
#: the first event stream: sse-starlette's lock) and prometheus_client's exposition.
SSL_CLASSES = ("SSLContext", "TLSVersion")


def _asyncio_tls(ssl: types.ModuleType) -> None:
    """``ssl`` has loaded: asyncio gets it as if it had been there at asyncio's import."""
    for name in _ASYNCIO_WITH_SSL:
        module = sys.modules.get(name)
        if module is not None:
            module.ssl = ssl  # type: ignore[attr-defined]
    sslproto = sys.modules.get("asyncio.sslproto")
    if sslproto is not None:  # computed at import when ssl is there; read on SSL reads only
        sslproto.SSLAgainErrors = (ssl.SSLWantReadError, ssl.SSLSyscallError)  # type: ignore[attr-defined]


def defer_openssl() -> bool:
    """Import asyncio, and make ``ssl``, ``hashlib`` and ``hmac`` deferred modules (see the
    module's docstring). False (and no effect) when asyncio or any of them is loaded."""
    if any(m in sys.modules for m in ("asyncio", "ssl", "hashlib", "hmac", "_hashlib", "_ssl")):
        return False
    # asyncio binds ``ssl`` at import and reads two of its exceptions there: it is imported
    # with no ssl (as on a Python built without it), then handed the deferred module.
    sys.modules["ssl"] = None  # type: ignore[assignment]  # "import ssl" raises ImportError
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]
    # Until ssl loads, asyncio.base_events sees none: no socket it is given can then be an
    # SSL socket (it checks each one). asyncio.sslproto gets the deferred module: its TLS
    # transports load ssl on first use, even for ``ssl=True`` with no context made before.
    ssl = deferred_module("ssl", preset=SSL_PRESET, classes=SSL_CLASSES, on_load=_asyncio_tls)
    sys.modules["asyncio.sslproto"].ssl = ssl  # type: ignore[attr-defined]
    deferred_module("hashlib")
    # ``secrets`` takes ``compare_digest`` from hmac at import: hmac's own choice when
    # OpenSSL is absent, the same constant-time comparison.
    from _operator import _compare_digest

    deferred_module("hmac", preset={"compare_digest": _compare_digest})
    return True
