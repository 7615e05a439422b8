"""Answers to changes are sent only once the change is durable.

The store commits on its own thread (``gridd.dbwriter``), and while the database is locked
or slow a change is kept in memory and queued rather than making the event loop wait
(``Store.durable``). A request that may have changed something (any method but GET, HEAD
and OPTIONS) is therefore answered only once every write made before its answer has
committed: a client told 200 or 201 can rely on it surviving a ``kill -9``. Reads are
answered at once, from memory. The wait holds only that request, never the loop: ``/health``
and the rest go on meanwhile.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gridd.api.errors import error_response
from gridd.errors import DISK_CODES, StoreError
from gridd.store import Store

#: Methods that never change anything: answered without waiting for the store.
READS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Requests that record nothing: a stop must be answered while the database is locked.
UNRECORDED = frozenset({"/shutdown"})


class DurableAnswers:
    """ASGI middleware: holds a changing request's response until its writes committed."""

    def __init__(self, app: ASGIApp, store: Store) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in READS or scope["path"] in UNRECORDED:
            await self.app(scope, receive, send)
            return
        store = self.store
        refused = False

        async def send_when_durable(message: Message) -> None:
            nonlocal refused
            if refused:
                return  # the handler's own answer, replaced by the store's refusal
            if message["type"] == "http.response.start" and store.queued:
                try:
                    await store.durable()
                except StoreError as exc:
                    refused = True
                    status = 507 if exc.code in DISK_CODES else 503
                    response = error_response(status, exc.code, exc.message, exc.details)
                    await response(scope, receive, send)
                    return
            await send(message)

        await self.app(scope, receive, send_when_durable)
