"""The baseline server: a bare Starlette app on uvicorn over a Unix socket.

It is served the way gridd serves itself (``asyncio.run``, the "auto" HTTP protocol, which is
httptools when installed, lifespan off, no access log, a socket we bind and pass in), minus
everything that is gridd: no peer-credential check, no Grid, no SQLite, no event bus.
``GET /health`` answers a body of the same shape as gridd's.

Run: ``python -m bench.bare_app /tmp/some.sock``; SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.unix_listen import listen_unix

_STARTED = time.monotonic()


async def health(request: Request) -> Response:
    return JSONResponse(
        {"status": "ok", "pid": os.getpid(), "uptime": round(time.monotonic() - _STARTED, 3)}
    )


def build_app() -> Starlette:
    return Starlette(routes=[Route("/health", health, methods=["GET"])])


def main(argv: list[str]) -> int:
    sock = listen_unix(argv[0])
    config = uvicorn.Config(
        build_app(),
        http="auto",
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_keep_alive=30,
    )
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
