"""An id holding a percent-encoded '/' is refused as the id it is, by any client: the HTTP
server decodes ``%2F`` before routing, so without the check ``/tasks/a%2Fb`` was "no such
endpoint" and ``POST /tasks/a%2Fstart`` acted on task ``a``. Run against a live daemon,
with requests written byte for byte (no client library re-encodes them)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gridd.api.errors import IdRoute, split_id
from tests.support.api import raw_http
from tests.support.daemons import DaemonProc


def ask(live: DaemonProc, method: str, target: str) -> tuple[int, dict[str, Any]]:
    raw = f"{method} {target} HTTP/1.1\r\nHost: gridd\r\nConnection: close\r\n"
    if method in ("POST", "PATCH"):
        raw += "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    else:
        raw += "\r\n"
    status, headers, body = raw_http(live.sock, raw.encode())
    assert headers["content-type"].startswith("application/json"), body
    doc = json.loads(body)
    assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message", "details"}
    return status, doc["error"]


@pytest.mark.parametrize(
    ("method", "target", "bad_id"),
    [
        ("GET", "/tasks/a%2Fb", "a/b"),
        ("GET", "/tasks/a%2fb", "a/b"),
        ("PATCH", "/tasks/a%2Fb", "a/b"),
        ("DELETE", "/tasks/a%2Fb", "a/b"),
        ("POST", "/tasks/..%2F..%2Fetc/approve", "../../etc"),
        ("GET", "/tasks/x%2Fy/diff", "x/y"),
    ],
)
def test_a_task_id_with_an_encoded_slash_is_an_invalid_task_id(
    live: DaemonProc, method: str, target: str, bad_id: str
) -> None:
    status, error = ask(live, method, target)
    assert (status, error["code"]) == (422, "invalid_task_id"), error
    assert error["message"].startswith(f"invalid task id {bad_id!r}: "), error
    assert error["details"]["id"] == bad_id


@pytest.mark.parametrize(
    ("target", "code", "bad_id"),
    [
        ("/agents/a%2Fb", "agent_not_found", "a/b"),
        ("/agents/a%2Fb/output", "agent_not_found", "a/b"),
        ("/questions/q%2F1", "question_not_found", "q/1"),
    ],
)
def test_an_agent_or_question_id_with_an_encoded_slash_is_not_found_by_its_name(
    live: DaemonProc, target: str, code: str, bad_id: str
) -> None:
    status, error = ask(live, "GET", target)
    assert (status, error["code"]) == (404, code), error
    assert error["message"] == f"no {code.split('_')[0]} {bad_id!r}"


def test_an_encoded_slash_never_acts_on_the_id_before_it(live: DaemonProc) -> None:
    c = live.client()
    c.post("/tasks", {"id": "a", "title": "a task an encoded slash must not reach"})
    before = c.get("/tasks/a")
    for method, target in (("POST", "/tasks/a%2Fstart"), ("DELETE", "/tasks/a%2Fstart")):
        status, error = ask(live, method, target)
        assert (status, error["code"]) == (422, "invalid_task_id"), (method, error)
        assert error["details"]["id"] == "a/start"
    status, error = ask(live, "POST", "/agents/a%2Fkill")
    assert (status, error["code"]) == (404, "agent_not_found"), error
    assert error["details"]["id"] == "a/kill"
    assert c.get("/tasks/a") == before


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/nosuch"),
        ("GET", "/tasks/x/nosuch"),
        ("GET", "/tasks/a%2Fb/nosuch"),
        ("GET", "/no%2Fsuch"),
        ("POST", "/tasks/a/b/start"),
    ],
)
def test_unknown_endpoints_stay_unknown_endpoints(
    live: DaemonProc, method: str, target: str
) -> None:
    status, error = ask(live, method, target)
    assert (status, error["code"]) == (404, "not_found"), error
    assert error["message"].startswith("no such endpoint: "), error


def test_split_id_reads_only_the_id_segment_of_an_id_route() -> None:
    routes = [
        r
        for r in map(IdRoute.of, ["/tasks", "/tasks/{task_id}", "/agents/{agent_id}/kill"])
        if r is not None
    ]
    assert split_id(b"/tasks/a%2Fb", routes) == ("task", "a/b")
    assert split_id(b"/agents/%2F/kill", routes) == ("agent", "/")
    assert split_id(b"/tasks/a%2Fb?x=%2F", routes) == ("task", "a/b")
    assert split_id(b"/tasks/ab", routes) is None
    assert split_id(b"/tasks/ab?x=%2F", routes) is None
    assert split_id(b"/agents/a%2Fb/nosuch", routes) is None
    assert split_id(b"/task%2Fs", routes) is None
