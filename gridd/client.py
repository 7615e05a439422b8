"""Clients for the daemon's Unix socket: sync (``gridctl``) and async (tests, benchmarks).

Errors come back as the same exception tree the daemon raises (``gridd.errors``), rebuilt
from the ``{"error": {...}}`` body; a socket nobody answers on is ``DaemonUnreachable``.
This module never imports the daemon side.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gridd import errors

_BY_STATUS: dict[int, type[errors.GriddError]] = {
    400: errors.BadRequest,
    403: errors.Forbidden,
    404: errors.NotFound,
    405: errors.MethodNotAllowed,
    409: errors.Conflict,
    422: errors.ValidationFailed,
}

BASE_URL = "http://gridd"


@dataclass(frozen=True)
class SSEEvent:
    """One event read off ``GET /events``."""

    id: int | None
    type: str
    data: Any

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "data": self.data}


def raise_for_error(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    if response.status_code == 503 and response.url.path == "/health":
        return  # a degraded daemon's health report is an answer, not an error
    try:
        body = response.json()["error"]
        code, message, details = body["code"], body["message"], body.get("details")
    except (ValueError, KeyError, TypeError):
        code, message, details = "http_error", response.text[:500], {}
    cls = _BY_STATUS.get(response.status_code, errors.GriddError)
    exc = cls(message, code=code, details=details)
    exc.status = response.status_code
    raise exc


def _unreachable(socket_path: Path, exc: Exception) -> errors.DaemonUnreachable:
    return errors.DaemonUnreachable(
        f"gridd is not answering on {socket_path} ({type(exc).__name__}: {exc})",
        details={"socket": str(socket_path)},
    )


class SSEParser:
    """Incremental text/event-stream parser (only what gridd sends: id, event, data)."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._type = "message"
        self._data: list[str] = []

    def feed_line(self, line: str) -> SSEEvent | None:
        if line == "":
            if not self._data:
                self._type = "message"
                return None
            raw = "\n".join(self._data)
            try:
                data: Any = json.loads(raw)
            except json.JSONDecodeError:
                data = raw
            event = SSEEvent(
                id=int(self._id) if self._id and self._id.isdigit() else None,
                type=self._type,
                data=data,
            )
            self._type, self._data = "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            self._id = value
        elif name == "event":
            self._type = value
        elif name == "data":
            self._data.append(value)
        return None


class GridClient:
    """Synchronous client over the workspace socket."""

    def __init__(self, socket_path: Path, *, timeout: float = 10.0) -> None:
        self.socket_path = socket_path
        self._http = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(socket_path)), base_url=BASE_URL, timeout=timeout
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GridClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise _unreachable(self.socket_path, exc) from None
        raise_for_error(response)
        if not response.content:
            return None
        return response.json()

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, json=body, **kwargs)

    def get_text(self, path: str) -> str:
        """A GET whose answer is text, not JSON (``/metrics``)."""
        try:
            response = self._http.get(path)
        except httpx.TransportError as exc:
            raise _unreachable(self.socket_path, exc) from None
        raise_for_error(response)
        return response.text

    def events(
        self,
        *,
        since: int | None = None,
        types: list[str] | None = None,
        read_timeout: float | None = None,
    ) -> Iterator[SSEEvent]:
        params: dict[str, str] = {}
        if since is not None:
            params["since"] = str(since)
        if types:
            params["types"] = ",".join(types)
        timeout = httpx.Timeout(10.0, read=read_timeout)
        try:
            with self._http.stream("GET", "/events", params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    raise_for_error(response)
                parser = SSEParser()
                for line in response.iter_lines():
                    event = parser.feed_line(line)
                    if event is not None:
                        yield event
        except httpx.TransportError as exc:
            if isinstance(exc, httpx.ReadTimeout):
                return
            if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
                return  # the daemon ended the stream (shutdown); resume with the last id
            raise _unreachable(self.socket_path, exc) from None


class AsyncGridClient:
    """Asynchronous client over the workspace socket."""

    def __init__(self, socket_path: Path, *, timeout: float = 10.0) -> None:
        self.socket_path = socket_path
        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket_path)),
            base_url=BASE_URL,
            timeout=timeout,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncGridClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise _unreachable(self.socket_path, exc) from None
        raise_for_error(response)
        if not response.content:
            return None
        return response.json()

    async def get(self, path: str, **kwargs: Any) -> Any:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return await self.request("POST", path, json=body, **kwargs)

    async def events(
        self,
        *,
        since: int | None = None,
        types: list[str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[SSEEvent]:
        params: dict[str, str] = {}
        if since is not None:
            params["since"] = str(since)
        if types:
            params["types"] = ",".join(types)
        timeout = httpx.Timeout(10.0, read=None)
        async with self._http.stream(
            "GET", "/events", params=params, headers=headers, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                raise_for_error(response)
            parser = SSEParser()
            async for line in response.aiter_lines():
                event = parser.feed_line(line)
                if event is not None:
                    yield event
