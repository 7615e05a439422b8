"""Request bodies: streamed up to a byte limit, then parsed as JSON or YAML within limits.

A body is read chunk by chunk and refused with 413 the moment it passes ``MAX_BODY_BYTES``
(or at once when its ``Content-Length`` says it will), so a 1 GiB upload never sits in
memory. Parsing refuses what would hurt later rather than now:

- nesting deeper than ``MAX_DEPTH`` (a RecursionError somewhere downstream otherwise);
- non-finite numbers (``NaN``, ``Infinity``, ``1e309``): stored, they would later be served
  as ``Infinity``, which is not JSON;
- YAML beyond safe loading: no tags that construct objects, at most ``MAX_ALIASES``
  aliases, and an expanded size no larger than the body limit (no billion laughs).

Bodies over ``OFF_LOOP_BYTES`` are parsed in a worker thread, so ``/health`` keeps
answering while a 30 MiB plan is read.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from starlette.requests import Request

from gridd.errors import BadRequest, PayloadTooLarge

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_DEPTH = 32
MAX_ALIASES = 100
OFF_LOOP_BYTES = 256 * 1024


def _yaml() -> tuple[Any, type[Any]]:
    """PyYAML and its safe loader, imported on the first YAML body: a daemon at rest never
    reads one, and the import costs ~10 % of a cold start."""
    import yaml

    return yaml, getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body larger than {limit} bytes",
        details={"limit": limit},
    )


async def read_limited(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, read as a stream; 413 as soon as it is known to pass ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


# -- JSON --------------------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range (non-finite)")
    return value


def check_depth(data: Any, limit: int = MAX_DEPTH) -> None:
    """Refuse documents nested deeper than ``limit`` (iteratively: no recursion to blow)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            raise BadRequest(
                f"request body is nested more than {limit} levels deep",
                code="nesting_too_deep",
                details={"limit": limit},
            )
        stack.extend((child, depth + 1) for child in children)


def parse_json(body: bytes) -> Any:
    """JSON with finite numbers and bounded depth; ``None`` for an empty body."""
    if not body.strip():
        return None
    try:
        data = json.loads(body, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise BadRequest(
            f"request body is nested more than {MAX_DEPTH} levels deep",
            code="nesting_too_deep",
            details={"limit": MAX_DEPTH},
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, huge ints, non-finite
        raise BadRequest(f"request body is not valid JSON: {exc}", code="malformed_json") from None
    check_depth(data)
    return data


# -- YAML --------------------------------------------------------------------------------------


def _yaml_problem(message: str, code: str = "malformed_yaml") -> BadRequest:
    return BadRequest(message, code=code)


def check_yaml_events(body: bytes, *, limit: int = MAX_BODY_BYTES) -> None:
    """Walk the YAML event stream: depth, alias count and expanded size within bounds.

    The expanded size is the body plus what every alias adds (the size of the node it
    names, aliases inside that node expanded too), each node counted once: a document
    without aliases is never refused here (the body itself is within the limit), so a plan
    accepted as JSON is accepted as YAML."""
    depth = 0
    aliases = 0
    total = len(body)
    # Per open collection: (anchor, expanded size so far); sizes of finished anchors by name.
    open_nodes: list[tuple[str | None, int]] = []
    anchored: dict[str, int] = {}

    def into_parent(size: int) -> None:
        if open_nodes:
            anchor, sofar = open_nodes[-1]
            open_nodes[-1] = (anchor, sofar + size)

    yaml, loader = _yaml()
    for event in yaml.parse(body, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise _yaml_problem(
                    f"plan uses more than {MAX_ALIASES} YAML aliases", code="too_many_aliases"
                )
            size = anchored.get(event.anchor or "", 1)
            total += size
            if total > limit:
                raise PayloadTooLarge(
                    f"plan expands to more than {limit} bytes (aliases)", details={"limit": limit}
                )
            into_parent(size)
        elif isinstance(event, yaml.ScalarEvent):
            size = len(event.value) + 2
            if event.anchor:
                anchored[event.anchor] = size
            into_parent(size)
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise BadRequest(
                    f"plan is nested more than {MAX_DEPTH} levels deep",
                    code="nesting_too_deep",
                    details={"limit": MAX_DEPTH},
                )
            open_nodes.append((event.anchor, 2))
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            anchor, size = open_nodes.pop()
            if anchor:
                anchored[anchor] = size
            into_parent(size)


def parse_yaml(body: bytes) -> Any:
    """Safe YAML (plain data only) within the limits above (request models refuse
    non-finite floats such as ``.inf``)."""
    yaml, loader = _yaml()
    try:
        check_yaml_events(body)
        data = yaml.load(body, Loader=loader)
    except RecursionError:
        raise BadRequest(
            f"plan is nested more than {MAX_DEPTH} levels deep", code="nesting_too_deep"
        ) from None
    except yaml.YAMLError as exc:
        raise _yaml_problem(f"plan is not valid YAML: {exc}") from None
    return data


# -- both, off the loop when large ------------------------------------------------------------------


async def read_document(request: Request, *, yaml_allowed: bool = False) -> Any:
    """The body as JSON (or YAML when allowed and so declared); ``None`` when empty."""
    body = await read_limited(request)
    as_yaml = yaml_allowed and "yaml" in request.headers.get("content-type", "")
    parse = parse_yaml if as_yaml else parse_json
    if len(body) <= OFF_LOOP_BYTES:
        return parse(body)
    return await asyncio.to_thread(parse, body)
