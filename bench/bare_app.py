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
import socket
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

_STARTED = time.monotonic()


async def health(request: Request) -> Response:
    return JSONResponse(
        {"status": "ok", "pid": os.getpid(), "uptime": round(time.monotonic() - _STARTED, 3)}
    )


def build_app() -> Starlette:
    return Starlette(routes=[Route("/health", health, methods=["GET"])])


def main(argv: list[str]) -> int:
    path = argv[0]
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(128)
    sock.setblocking(False)
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
