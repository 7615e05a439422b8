"""The stack floor: the libraries gridd runs on, loaded as gridd loads them, and no gridd.

``bench_idle`` compares gridd's idle memory with it, beside the bare app. It holds:
- asyncio, and uvicorn's server and httptools protocol without uvicorn's command line, by
  gridd's own loader (``gridd/api/uvicorn_core.py``, read as a file: importing it as
  ``gridd.api.uvicorn_core`` would import the ``gridd.api`` package, that is all of gridd);
- Starlette, serving ``GET /health``;
- pydantic without its plugin search, and OpenSSL deferred until used (``gridd.lean``, as
  gridd's entry point does), one model validated and serialized;
- SQLite: one database in WAL mode, beside the socket (``<socket>.db``);
- ``logging.handlers``.

What an idle gridd holds above this is gridd itself: its modules, models, settings and state.

Run: ``python -m bench.stack_app /tmp/some.sock``; SIGTERM stops it.
"""

from __future__ import annotations

import sys

from gridd.lean import defer_openssl

defer_openssl()  # before asyncio (imported below) and anything else, as gridd's entry point

import asyncio  # noqa: E402
import importlib.util  # noqa: E402
import logging.handlers  # noqa: E402
import os  # noqa: E402
import sqlite3  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

import gridd  # noqa: E402
from bench.unix_listen import listen_unix  # noqa: E402
from gridd.lean import without_pydantic_plugins  # noqa: E402


def _uvicorn_core() -> types.ModuleType:
    path = Path(gridd.__file__).parent / "api" / "uvicorn_core.py"
    spec = importlib.util.spec_from_file_location("stack_uvicorn_core", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    without_pydantic_plugins()
    core = _uvicorn_core()
    from pydantic import BaseModel, Field
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    class Health(BaseModel):
        status: str
        pid: int = Field(ge=1)

    async def health(request: Request) -> Response:
        return JSONResponse(Health(status="ok", pid=os.getpid()).model_dump(mode="json"))

    path = argv[0]
    db = sqlite3.connect(f"{path}.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
    logging.getLogger("stack").addHandler(logging.handlers.WatchedFileHandler(f"{path}.log"))
    sock = listen_unix(path)
    config = core.Config(
        Starlette(routes=[Route("/health", health, methods=["GET"])]),
        http="httptools",
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
    )
    # uvicorn re-raises the SIGTERM it caught once it has stopped: the process ends there,
    # and whoever started it removes ``<socket>.*`` (``bench.common.running_app`` does).
    asyncio.run(core.Server(config).serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
