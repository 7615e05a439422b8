"""Asking a running daemon over its socket: raw HTTP, one JSON call whatever its status,
and the questions tests ask again and again (a task's status, a pending question, the
scheduler's decision, an agent's output)."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from gridd.client import GridClient
from tests.support.waits import wait_for


def socket_answers(sock: Path) -> bool:
    """True when a daemon answers ``GET /health`` on ``sock``."""
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=1.0) as c:
            return c.get("http://gridd/health").status_code == 200
    except (httpx.TransportError, OSError):
        return False


def raw_http(
    sock: Path, request: bytes, *, timeout: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes to the socket, read until the server closes; (status, headers, body)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(request)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def api_call(
    sock: Path, method: str, path: str, body: object = None, *, timeout: float = 10.0
) -> tuple[int, object]:
    """(status, JSON body) of one request, whatever the status (no exception for 4xx)."""
    transport = httpx.HTTPTransport(uds=str(sock))
    with httpx.Client(transport=transport, base_url="http://gridd", timeout=timeout) as http:
        response = http.request(method, path, json=body)
    return response.status_code, (response.json() if response.content else None)


def wait_task_status(
    client: GridClient, task_id: str, wanted: str, *, timeout: float = 30.0
) -> dict[str, object]:
    """The task (as ``GET /tasks/{id}`` shows it) once its status is ``wanted``."""

    def check() -> dict[str, object] | None:
        task: dict[str, object] = client.get(f"/tasks/{task_id}")
        return task if task["status"] == wanted else None

    found: dict[str, object] = wait_for(
        check, timeout=timeout, message=f"task {task_id} to be {wanted}"
    )
    return found


def scheduler_starts(client: GridClient) -> list[str]:
    """Reconcile once, now (``POST /scheduler/step``), and return the task ids it started.

    The way to assert that nothing starts: ask the scheduler for its decision instead of
    sleeping through a few ticks and hoping one of them looked."""
    step = client.post("/scheduler/step")
    return [str(a["taskId"]) for a in step["actions"] if a["action"] == "start"]


def wait_pending_question(
    client: GridClient, task_id: str, *, timeout: float = 30.0
) -> dict[str, object]:
    """The first pending question of ``task_id`` (``GET /questions``), once there is one."""

    def check() -> dict[str, object] | None:
        for question in client.get("/questions"):
            if question["taskId"] == task_id:
                return question  # type: ignore[no-any-return]
        return None

    found: dict[str, object] = wait_for(
        check, timeout=timeout, interval=0.05, message=f"a pending question from {task_id}"
    )
    return found


def output_chunks(client: GridClient, agent_id: str, *, limit: int = 50) -> list[dict[str, object]]:
    """Every output chunk of an agent through ``GET /agents/{id}/output``, page by page."""
    chunks: list[dict[str, object]] = []
    since = 0
    while True:
        page = client.get(f"/agents/{agent_id}/output", params={"since": since, "limit": limit})
        chunks += page["chunks"]
        if not page["chunks"]:
            return chunks
        since = int(page["chunks"][-1]["seq"])
