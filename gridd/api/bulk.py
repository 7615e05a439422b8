"""Big requests off the event loop: a 50,000-task ``POST /tasks`` or ``POST /plans``.

Validating 50,000 task specs, building the tasks, writing them and encoding the answer each
take seconds of CPU: on the loop, ``/health`` waited that long (6.6 s in the issue, 13.7 s
measured on a loaded machine). Past ``YIELD_ABOVE`` items the specs are validated, the
tasks built and their rows and ``tasks.changed`` events encoded in chunks with a turn of
the loop between them (``lean.BulkPace``, which also keeps the cycle collector's walks
short; ``Commands.create_tasks_yielding``, ``GridState.add_tasks_yielding``), and written
in one transaction; the answer is streamed, encoded a chunk at a time, and the events are
fanned out a few per turn of the loop (``EventBus``). A second after the answer the heap's free pages are handed back
(``memory.trim``): the daemon returns to what it holds at rest, not to what the request
borrowed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gridd import memory
from gridd.api.errors import validate, validation_details
from gridd.commands import YIELD_ABOVE
from gridd.errors import ValidationFailed
from gridd.lean import BulkPace
from gridd.model import WireModel
from gridd.specs import PlanSpec, TaskSpec

#: Task specs validated, and tasks encoded, per step of a big request.
CHUNK = 100
#: A big request's memory is handed back this long after its answer was sent.
TRIM_AFTER_SECONDS = 1.0


async def validate_plan(data: Any, *, within: str = "") -> PlanSpec:
    """``validate(PlanSpec, data)`` for a plan of any size: past ``YIELD_ABOVE`` tasks in
    chunks of ``CHUNK``, yielding between them (pydantic validates a list in one call that
    holds the interpreter: 50,000 specs held the loop for seconds, on a thread as well).
    Problems name the same places as one validation would."""
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, list) or len(tasks) <= YIELD_ABOVE:
        return validate(PlanSpec, data, within=within)
    # The plan's other fields (an unknown one is refused) with its first task only.
    validate(PlanSpec, {**data, "tasks": tasks[:1]}, within=within)
    limit = _max_tasks()
    if limit is not None and len(tasks) > limit:
        field = "(body)" if within else "tasks"
        problem = f"List should have at most {limit} items after validation, not {len(tasks)}"
        raise ValidationFailed(
            f"invalid request: {field}: {problem}",
            details={"problems": [{"field": field, "problem": problem}]},
        )
    specs: list[TaskSpec] = []
    pace = BulkPace()
    for start in range(0, len(tasks), CHUNK):
        await pace.step(CHUNK)
        try:
            part = PlanSpec.model_validate({"tasks": tasks[start : start + CHUNK]})
        except ValidationError as exc:
            problems = _shifted(validation_details(exc, within), by=start, within=within)
            first = problems[0]
            raise ValidationFailed(
                f"invalid request: {first['field']}: {first['problem']}",
                details={"problems": problems},
            ) from None
        specs += part.tasks
    return PlanSpec.model_construct(tasks=specs)


def _max_tasks() -> int | None:
    """The most tasks a plan may hold (``PlanSpec.tasks``' own bound)."""
    for rule in PlanSpec.model_fields["tasks"].metadata:
        limit = getattr(rule, "max_length", None)
        if isinstance(limit, int):
            return limit
    return None


def _shifted(problems: list[dict[str, Any]], *, by: int, within: str) -> list[dict[str, Any]]:
    """Problems of a chunk named as places in the whole list: its task indexes moved by
    ``by`` (the index is the first part of a field, or the second after ``tasks.``)."""
    at = 0 if within else 1
    for problem in problems:
        parts = str(problem["field"]).split(".")
        if len(parts) > at and parts[at].isdigit():
            parts[at] = str(int(parts[at]) + by)
            problem["field"] = ".".join(parts)
    return problems


def answered_big(response: Response, items: int) -> Response:
    """``response``, handing memory back once it is sent when the request was a big one."""
    if items > YIELD_ABOVE:
        response.background = BackgroundTask(_trim_soon)
    return response


async def _trim_soon() -> None:
    """Trim once the answer, its queued write and its events' fan-out have let go of what
    they held (``TRIM_AFTER_SECONDS``), on a worker thread: trimming right after the
    send measured 330 MB kept where a trim a second later left 250 (50,000 tasks)."""
    loop = asyncio.get_running_loop()
    loop.call_later(TRIM_AFTER_SECONDS, loop.run_in_executor, None, memory.trim)


def wire_many(models: list[WireModel], *, status: int = 200) -> Response:
    """``spec.wire`` for a list of any length. Past ``YIELD_ABOVE`` items the answer is
    streamed, ``CHUNK`` items encoded per send: the server sends each piece as the client
    takes it (no 30 MB copy waiting in the socket's buffer), the loop answers others between
    pieces, and the memory is handed back once the last is sent."""
    if len(models) <= YIELD_ABOVE:
        return JSONResponse([m.wire() for m in models], status_code=status)
    response = _Streamed(_pieces(models), status_code=status, media_type="application/json")
    return answered_big(response, len(models))


class _Streamed(StreamingResponse):
    """A ``StreamingResponse`` that sends its pieces in the request's own task. uvicorn
    speaks ASGI 2.3, for which Starlette sends beside a disconnect listener in an anyio task
    group: the first big answer imported anyio's asyncio backend on the loop (60 ms idle,
    350 ms measured on a loaded machine). A client gone meanwhile is not listened for:
    uvicorn drops what is sent after it left, and the pieces left are encoded for nothing."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.stream_response(send)
        if self.background is not None:
            await self.background()


async def _pieces(models: list[WireModel]) -> AsyncIterator[bytes]:
    for start in range(0, len(models), CHUNK):
        await asyncio.sleep(0)  # a send that need not wait does not yield by itself
        wires = [m.wire() for m in models[start : start + CHUNK]]
        part = json.dumps(wires, ensure_ascii=False, separators=(",", ":"))  # as JSONResponse
        yield (("[" if start == 0 else ",") + part[1:-1]).encode()
    yield b"]"
