"""Pages of a long list: ``?limit=N&after=<id>`` on ``/tasks``, ``/agents`` and ``/questions``.

Without either parameter a list is served whole, as covend's clients expect. With ``limit``,
at most that many items come back in the list's usual order, and the response header
``Grid-Next-After`` names the id to pass as ``after`` for the next page (absent on the last
page). ``after`` naming an id the list does not hold is a 400 (``bad_cursor``): the item may
have left the list, and silently restarting would repeat or skip items.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse

from gridd.api.errors import query_int
from gridd.errors import BadRequest
from gridd.model import WireModel

T = TypeVar("T", bound=WireModel)

NEXT_HEADER = "Grid-Next-After"
MAX_LIMIT = 10_000
PAGE_QUERY = {
    "limit": f"page size (1-{MAX_LIMIT}); the Grid-Next-After header names the next page",
    "after": "the id from Grid-Next-After: the page after that item",
}


def paged(request: Request) -> bool:
    """True when the request asks for a page (``limit`` or ``after``)."""
    params = request.query_params
    return bool(params.get("limit") or params.get("after"))


def page_of(request: Request, items: Sequence[T], *, key: Callable[[T], str]) -> JSONResponse:
    """One page of ``items`` as a JSON array, with the next page's cursor in a header."""
    limit = min(query_int(request, "limit", minimum=1) or MAX_LIMIT, MAX_LIMIT)
    after = request.query_params.get("after")
    start = 0
    if after:
        start = next((i + 1 for i, item in enumerate(items) if key(item) == after), -1)
        if start < 0:
            raise BadRequest(
                f"'after' names {after[:80]!r}, which this list does not hold",
                code="bad_cursor",
                details={"after": after[:80]},
            )
    chunk = list(items[start : start + limit])
    response = JSONResponse([item.wire() for item in chunk])
    if chunk and start + limit < len(items):
        response.headers[NEXT_HEADER] = key(chunk[-1])
    return response
