"""Every malformed request gets a 4xx with ``{"error": {"code", "message", "details"}}``;
nothing a client sends produces a 500 or a traceback. Run against a live daemon."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.support.api import raw_http
from tests.support.daemons import DaemonProc


def request(
    sock: Path,
    method: str,
    target: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> tuple[int, dict[str, str], bytes]:
    lines = [f"{method} {target} HTTP/1.1", "Host: gridd", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    return raw_http(sock, raw)


def assert_error(status: int, headers: dict[str, str], body: bytes, expected: int) -> dict:  # type: ignore[type-arg]
    assert status == expected, body
    assert headers["content-type"].startswith("application/json")
    doc = json.loads(body)
    assert set(doc) == {"error"}
    assert set(doc["error"]) == {"code", "message", "details"}
    assert isinstance(doc["error"]["code"], str) and doc["error"]["code"]
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"]
    assert isinstance(doc["error"]["details"], dict)
    return doc["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("method", "target", "headers", "status", "code"),
    [
        ("GET", "/no/such/thing", {}, 404, "not_found"),
        ("DELETE", "/health", {}, 405, "method_not_allowed"),
        ("PUT", "/events", {}, 405, "method_not_allowed"),
        ("GET", "/shutdown", {}, 405, "method_not_allowed"),
        ("GET", "/events?since=abc", {}, 400, "bad_query"),
        ("GET", "/events?since=1.5", {}, 400, "bad_query"),
        ("GET", "/events?since=-1", {}, 422, "validation_failed"),
        ("GET", "/events", {"Last-Event-ID": "abc"}, 400, "bad_last_event_id"),
        ("GET", "/events", {"Last-Event-ID": "-3"}, 400, "bad_last_event_id"),
        ("GET", "/events?types=Agent.Output", {}, 400, "bad_query"),
        ("GET", "/events?types=a%20b", {}, 400, "bad_query"),
        ("GET", "/events?types=" + "x" * 65, {}, 400, "bad_query"),
        ("GET", "/events?types=" + ",".join(f"t{n}" for n in range(65)), {}, 400, "bad_query"),
    ],
)
def test_malformed_request_gets_a_json_error(
    live: DaemonProc, method: str, target: str, headers: dict[str, str], status: int, code: str
) -> None:
    error = assert_error(*request(live.sock, method, target, headers=headers), status)
    assert error["code"] == code


def test_not_found_and_method_not_allowed_say_what_was_asked(live: DaemonProc) -> None:
    error = assert_error(*request(live.sock, "GET", "/nope"), 404)
    assert error["message"] == "no such endpoint: GET /nope"
    status, headers, body = request(live.sock, "DELETE", "/health")
    error = assert_error(status, headers, body, 405)
    assert "GET" in headers["allow"]


def test_garbage_body_to_an_unknown_route_is_404_json(live: DaemonProc) -> None:
    for body in (b"{not json", b"\xff\xfe\x00garbage", b'{"a": 1}'):
        assert_error(
            *request(
                live.sock,
                "POST",
                "/tasks/x/nope",
                headers={"Content-Type": "application/json"},
                body=body,
            ),
            404,
        )


@pytest.mark.parametrize(
    "raw",
    [
        b"get /health HTTP/1.1\r\nHost: gridd\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: gridd\r\nX-Bad: a\x01b\r\n\r\n",
        b"GET /health HTTP/9.9\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 this is TLS\r\n\r\n",
        b"POST /shutdown HTTP/1.1\r\nHost: gridd\r\nContent-Length: nope\r\n\r\n",
        b"GET /he alth HTTP/1.1\r\nHost: gridd\r\n\r\n",
    ],
    ids=["lowercase-method", "control-byte-header", "bad-version", "tls", "bad-length", "space"],
)
def test_request_that_is_not_http_gets_a_json_400(live: DaemonProc, raw: bytes) -> None:
    error = assert_error(*raw_http(live.sock, raw), 400)
    assert error["code"] == "malformed_http"
    assert live.client().get("/health")["status"] == "ok"


def test_head_on_the_event_stream_answers_without_hanging(live: DaemonProc) -> None:
    status, headers, body = request(live.sock, "HEAD", "/events")
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert body == b""


_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "PROPFIND"]
_PATHS = [
    "/",
    "/health",
    "/version",
    "/state",
    "/events",
    "/openapi.json",
    "/tasks",
    "/agents",
    "/tasks/x/start",
    "/agents/a-1/output",
    "/agents/../etc/passwd",
    "/%ff%fe",
    "/%",
    "/" + "a" * 3000,
    "//",
    "/state?x=%zz",
    "/events?since=",
    "/events?since=0x10",
    "/events?since=99999999999999999999999",
    "/events?since=1e9",
    "/events?since=%00",
    "/events?types=,,,",
    "/events?types=a..b",
    "/health#frag",
    "/health?%00=%00",
    "/events?since=%20%201",
    "/questions",
    "/session/start",
    "/session/stop?force=1",
]
_HEADERS = [
    ("Last-Event-ID", "abc"),
    ("Last-Event-ID", "-5"),
    ("Last-Event-ID", "9" * 40),
    ("Last-Event-ID", " "),
    ("Content-Type", "application/json"),
    ("Content-Type", "text/x-junk"),
    ("Accept", "*/*"),
    ("Accept", "text/event-stream"),
    ("X-" + "a" * 60, "b" * 2000),
    ("Upgrade", "websocket"),
    ("Connection", "Upgrade"),
    ("Expect", "100-continue"),
    ("Content-Encoding", "gzip"),
    ("Range", "bytes=0-1"),
    ("Cookie", "a=" + "c" * 500),
]
_BODIES = [b"", b"{", b"garbage", b'{"a": 1}', b"[]", b"null", b'"x"', b"{" * 2000]


def test_fuzzed_requests_never_get_a_5xx_or_a_traceback(live: DaemonProc) -> None:
    rnd = random.Random(20240601)
    for _ in range(300):
        method = rnd.choice(_METHODS)
        path = rnd.choice(_PATHS)
        if rnd.random() < 0.3:
            path = "/" + "".join(rnd.choice("abz09/%.?=&-_~+") for _ in range(rnd.randint(0, 40)))
        if method == "POST" and path.rstrip("/") == "/shutdown":
            continue
        if path.startswith("/events") and method == "GET" and "since" not in path:
            path += ("&" if "?" in path else "?") + "since=999999999"  # a finite answer: reset
        headers = dict(rnd.sample(_HEADERS, rnd.randint(0, 3)))
        if path.startswith("/events") and method == "GET":
            headers.pop("Last-Event-ID", None)
        body = rnd.choice(_BODIES) if method in {"POST", "PUT", "PATCH"} else b""
        try:
            status, resp_headers, resp_body = (
                request(live.sock, method, path, headers=headers, body=body)
                if not (path.startswith("/events") and method == "GET")
                else _first_response(live.sock, path, headers)
            )
        except TimeoutError:
            pytest.fail(f"no answer to {method} {path} {headers}")
        assert status < 500, (method, path, headers, resp_body[:300])
        if status >= 400 and method != "HEAD":
            assert_error(status, resp_headers, resp_body, status)
    assert live.client().get("/health")["status"] == "ok"
    log = live.stderr_text()
    assert "Traceback" not in log
    assert "unhandled error" not in log


def _first_response(
    sock: Path, path: str, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """For streams: status and headers (and a JSON body when it is an error)."""
    import socket

    lines = [f"GET {path} HTTP/1.1", "Host: gridd", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        parsed = {}
        for line in head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            parsed[name.strip().lower()] = value.strip()
        if status >= 400:
            while chunk := s.recv(65536):
                rest += chunk
        return status, parsed, rest
