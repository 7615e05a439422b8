"""The stack floor: the libraries gridd runs on, loaded as gridd loads them, and no gridd.

``bench_idle`` compares gridd's idle memory with it, beside the bare app. It holds:
- asyncio, and uvicorn's server and httptools protocol, imported as gridd imports them;
- Starlette, serving ``GET /health``;
- pydantic without its plugin search (``gridd.lean``, as gridd's entry point does), one
  model validated and serialized;
- SQLite: one database in WAL mode, beside the socket (``<socket>.db``);
- ``logging.handlers``.

What an idle gridd holds above this is gridd itself: its modules, models, settings and state.

Run: ``python -m bench.stack_app /tmp/some.sock``; SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import logging.handlers
import os
import sqlite3
import sys

from bench.unix_listen import listen_unix
from gridd.lean import without_pydantic_plugins


def main(argv: list[str]) -> int:
    without_pydantic_plugins()
    from pydantic import BaseModel, Field
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from uvicorn.config import Config
    from uvicorn.server import Server

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
    config = Config(
        Starlette(routes=[Route("/health", health, methods=["GET"])]),
        http="httptools",
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
    )
    # uvicorn re-raises the SIGTERM it caught once it has stopped: the process ends there,
    # and whoever started it removes ``<socket>.*`` (``bench.common.running_app`` does).
    asyncio.run(Server(config).serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
