"""Hostile request bodies get a 4xx naming the problem, never a 500, and nothing invalid is
stored: explicit nulls, non-finite numbers, deep nesting, control characters, huge bodies
and YAML bombs. Run against a live daemon over its socket."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from tests.support.api import raw_http
from tests.support.daemons import DaemonProc
from tests.support.waits import wait_for


def send(
    sock: Path, method: str, target: str, body: bytes | str = b"", ctype: str = "application/json"
) -> tuple[int, dict[str, object]]:
    raw_body = body.encode() if isinstance(body, str) else body
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: gridd\r\nConnection: close\r\n"
        f"Content-Type: {ctype}\r\nContent-Length: {len(raw_body)}\r\n\r\n"
    )
    status, _, data = raw_http(sock, head.encode() + raw_body, timeout=30)
    return status, json.loads(data) if data else {}


def error_code(doc: dict[str, object]) -> str:
    error = doc["error"]
    assert isinstance(error, dict)
    return str(error["code"])


_counter = iter(range(1_000_000))


def new_task(live: DaemonProc) -> str:
    task_id = f"t{next(_counter)}-{int(time.time() * 1000) % 100000}"
    status, doc = send(live.sock, "POST", "/tasks", json.dumps({"id": task_id, "title": "x"}))
    assert status == 201, doc
    return task_id


@pytest.mark.parametrize("field", ["title", "priority", "prompt", "labels", "maxAttempts"])
def test_patch_with_explicit_null_on_a_required_field_is_422(live: DaemonProc, field: str) -> None:
    task_id = new_task(live)
    status, doc = send(live.sock, "PATCH", f"/tasks/{task_id}", json.dumps({field: None}))
    assert status == 422, doc
    task = live.client().get(f"/tasks/{task_id}")
    assert task["title"] == "x" and task["priority"] == 2 and task["labels"] == []


def test_patch_depends_on_null_is_422(live: DaemonProc) -> None:
    task_id = new_task(live)
    status, doc = send(live.sock, "PATCH", f"/tasks/{task_id}", '{"dependsOn": null}')
    assert status == 422, doc


def test_patch_null_clears_an_optional_field(live: DaemonProc) -> None:
    task_id = new_task(live)
    status, doc = send(live.sock, "PATCH", f"/tasks/{task_id}", '{"timeoutSeconds": 60}')
    assert status == 200 and doc["timeoutSeconds"] == 60
    status, doc = send(live.sock, "PATCH", f"/tasks/{task_id}", '{"timeoutSeconds": null}')
    assert status == 200 and doc["timeoutSeconds"] is None, doc


def test_create_with_depends_on_null_is_422(live: DaemonProc) -> None:
    status, doc = send(live.sock, "POST", "/tasks", '{"title": "x", "dependsOn": null}')
    assert status == 422, doc
    status, doc = send(live.sock, "POST", "/plans", '{"tasks": [{"title": "x", "after": null}]}')
    assert status == 422, doc


@pytest.mark.parametrize("number", ["1e309", "-1e999", "NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(live: DaemonProc, number: str) -> None:
    status, doc = send(live.sock, "POST", "/session/start", f'{{"budgetUsd": {number}}}')
    assert 400 <= status < 500, doc
    status, doc = send(live.sock, "POST", "/tasks", f'{{"title": "x", "timeoutSeconds": {number}}}')
    assert 400 <= status < 500, doc
    # /state stays valid JSON (Python's json would accept Infinity; be strict)
    state = live.client().get("/state")
    assert state["session"].get("budgetUsd") in (None, 50.0) or isinstance(
        state["session"]["budgetUsd"], float
    )
    text = json.dumps(state, allow_nan=False)
    assert "Infinity" not in text


def test_non_finite_yaml_numbers_are_refused(live: DaemonProc) -> None:
    body = "tasks:\n  - title: x\n    timeoutSeconds: .inf\n"
    status, doc = send(live.sock, "POST", "/plans", body, ctype="application/yaml")
    assert status == 422, doc


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_deeply_nested_json_is_a_4xx(live: DaemonProc, depth: int) -> None:
    body = '{"title": ' + "[" * depth + "]" * depth + "}"
    status, doc = send(live.sock, "POST", "/tasks", body)
    assert 400 <= status < 500, doc
    status, doc = send(live.sock, "POST", "/plans", "[" * depth + "]" * depth)
    assert 400 <= status < 500, doc


def test_deeply_nested_yaml_is_a_4xx(live: DaemonProc) -> None:
    body = "tasks: " + "[" * 1000 + "]" * 1000
    status, doc = send(live.sock, "POST", "/plans", body, ctype="application/yaml")
    assert 400 <= status < 500, doc


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("title", "a\x00b"),
        ("title", "line\nbreak"),
        ("title", "bell\x07"),
        ("title", "esc\x1b[31m"),
        ("prompt", "nul\x00here"),
        ("labels", ["a\x00"]),
        ("agent", "x\x01"),
    ],
)
def test_control_characters_in_text_that_reaches_git_are_422(
    live: DaemonProc, field: str, value: object
) -> None:
    status, doc = send(live.sock, "POST", "/tasks", json.dumps({"title": "ok", field: value}))
    assert status == 422, doc
    task_id = new_task(live)
    status, doc = send(live.sock, "PATCH", f"/tasks/{task_id}", json.dumps({field: value}))
    assert status == 422, doc


def test_prompt_keeps_newlines_and_tabs(live: DaemonProc) -> None:
    body = json.dumps({"title": "ok", "prompt": "line one\n\tline two\r\n"})
    status, doc = send(live.sock, "POST", "/tasks", body)
    assert status == 201, doc


def send_until_answered(sock: Path, head: bytes, chunk: bytes, most: int) -> tuple[bytes, int]:
    """Send ``head`` then ``chunk`` repeatedly (up to ``most`` bytes) until the server
    answers; (the answer's head, bytes of body sent)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(sock))
        s.sendall(head)
        s.setblocking(False)
        sent, reply, pending = 0, b"", memoryview(chunk)
        while sent < most and not reply:
            try:
                n = s.send(pending)
                sent += n
                pending = pending[n:] if n < len(pending) else memoryview(chunk)
            except BlockingIOError:
                time.sleep(0.005)
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                reply += s.recv(65536)
            except BlockingIOError:
                pass
        s.settimeout(10)
        try:
            while b"\r\n\r\n" not in reply:
                data = s.recv(65536)
                if not data:
                    break
                reply += data
        except (ConnectionResetError, TimeoutError):
            pass
    return reply, sent


def test_a_body_over_the_limit_is_413_without_reading_it_all(live: DaemonProc) -> None:
    """The daemon answers 413 once the limit is passed and reads no further: a client
    still sending its 1 GiB sees the answer after a few dozen MiB, not after 1 GiB."""
    head = (
        b"POST /tasks HTTP/1.1\r\nHost: gridd\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (1024**3)
    )
    reply, sent = send_until_answered(live.sock, head, b" " * 1024 * 1024, 256 * 1024 * 1024)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert sent < 256 * 1024 * 1024
    assert live.client().get("/health")["status"] == "ok"


def test_a_chunked_body_over_the_limit_is_413(live: DaemonProc) -> None:
    head = (
        b"POST /tasks HTTP/1.1\r\nHost: gridd\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b" " * (1024 * 1024)
    chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
    reply, _ = send_until_answered(live.sock, head, chunk, 256 * 1024 * 1024)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"payload_too_large" in reply or b"content-length" in reply.lower()
    assert live.client().get("/health")["status"] == "ok"


def test_yaml_aliases_beyond_a_small_bound_are_refused(live: DaemonProc) -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for n in range(1, 9):
        prev = chr(ord("a") + n - 1)
        cur = chr(ord("a") + n)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    lines.append("tasks: [{title: bomb, labels: *i}]")
    status, doc = send(live.sock, "POST", "/plans", "\n".join(lines), ctype="application/yaml")
    assert status in (400, 413, 422), doc
    assert live.client().get("/health")["status"] == "ok"


def test_yaml_tags_are_not_constructed(live: DaemonProc) -> None:
    body = "tasks:\n  - title: !!python/object/apply:os.system ['touch /tmp/pwned-gridd']\n"
    status, doc = send(live.sock, "POST", "/plans", body, ctype="application/yaml")
    assert 400 <= status < 500, doc


def test_a_large_plan_does_not_block_health(live: DaemonProc) -> None:
    """A multi-megabyte YAML plan is parsed off the event loop: /health answers meanwhile.
    (The plan is refused at validation, its last task naming an unknown field, so the
    time spent is the parsing alone.)"""
    import threading

    tasks = "\n".join(f"  - {{id: big-{n}, title: 'task {n}'}}" for n in range(20_000))
    body = f"tasks:\n{tasks}\n  - {{title: last, nonsense: 1}}\n"
    result: dict[str, object] = {}

    def post() -> None:
        result["status"], result["doc"] = send(
            live.sock, "POST", "/plans", body, ctype="application/yaml"
        )

    thread = threading.Thread(target=post)
    thread.start()
    answered = 0
    client = live.client(timeout=60)
    while thread.is_alive():
        assert client.get("/health")["status"] == "ok"
        answered += thread.is_alive()
    thread.join()
    assert result["status"] == 422, result
    # Parsing 20,000 YAML tasks takes seconds. On the loop it would hold every /health
    # until the plan was answered; off the loop they keep being answered meanwhile.
    assert answered >= 5, answered


def test_openapi_documents_the_statuses_the_server_answers_with(live: DaemonProc) -> None:
    doc = live.client().get("/openapi.json")
    paths = doc["paths"]
    created = paths["/tasks"]["post"]
    assert "201" in created["responses"] and "200" not in created["responses"]
    assert "413" in created["responses"] and "507" in created["responses"]
    body = created["requestBody"]["content"]["application/json"]["schema"]
    assert {"type": "array", "items": {"$ref": "#/components/schemas/TaskSpec"}} in body["oneOf"]
    assert "201" in paths["/plans"]["post"]["responses"]
    assert "application/yaml" in paths["/plans"]["post"]["requestBody"]["content"]
    assert "202" in paths["/shutdown"]["post"]["responses"]
    # and the server does answer with what is documented
    status, _ = send(live.sock, "POST", "/tasks", '[{"title": "a"}, {"title": "b"}]')
    assert status == 201


# -- honest limits (#30) --------------------------------------------------------------------------


def test_a_9_mib_yaml_plan_without_aliases_is_accepted_as_its_json_is(daemon: DaemonProc) -> None:
    """The YAML expansion limit counts each node once: before, every value was counted
    again for each collection around it, and this plan was 413 "(aliases)"."""
    prompt = "x" * 100_000
    tasks = [{"id": f"big-{n}", "title": f"task {n}", "prompt": prompt} for n in range(95)]
    body = "tasks:\n" + "".join(
        f"  - id: {t['id']}\n    title: {t['title']}\n    prompt: {t['prompt']}\n" for t in tasks
    )
    assert len(body) > 9 * 1024 * 1024
    status, doc = send(daemon.sock, "POST", "/plans", body, ctype="application/yaml")
    assert status == 201, str(doc)[:500]
    listed = daemon.client(timeout=30).get("/tasks")
    assert len(listed) == 95 and all(len(t["prompt"]) == 100_000 for t in listed)


@pytest.mark.parametrize(
    "method,target", [("GET", "/tasks/"), ("POST", "/tasks/"), ("GET", "/health/")]
)
def test_a_trailing_slash_is_answered_in_the_json_error_format(
    live: DaemonProc, method: str, target: str
) -> None:
    status, doc = send(live.sock, method, target, "{}" if method == "POST" else b"")
    assert status == 404, doc
    assert error_code(doc) == "not_found"
    error = doc["error"]
    assert isinstance(error, dict) and "trailing" in str(error["message"])


def requests_counted(live: DaemonProc, method: str, route: str, code: str | None = None) -> float:
    """``gridd_http_requests_total`` for ``method`` and ``route`` (and ``code``), summed."""
    total = 0.0
    for line in live.client().get_text("/metrics").splitlines():
        if not line.startswith("gridd_http_requests_total{"):
            continue
        labels, _, value = line.partition("} ")
        wanted = [f'method="{method}"', f'route="{route}"', *([f'code="{code}"'] if code else [])]
        if all(label in labels for label in wanted):
            total += float(value)
    return total


def test_a_client_that_disconnects_mid_request_is_not_an_error(live: DaemonProc) -> None:
    log_before = len(live.stderr_text())
    seen = requests_counted(live, "POST", "/tasks")
    failed = requests_counted(live, "POST", "/tasks", "500")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(live.sock))
        s.sendall(
            b"POST /tasks HTTP/1.1\r\nHost: gridd\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100000\r\n\r\n{"title": "never fin'
        )
    wait_for(
        lambda: requests_counted(live, "POST", "/tasks") > seen,
        timeout=10,
        message="the abandoned request to be counted",
    )
    assert requests_counted(live, "POST", "/tasks", "500") == failed
    logged = live.stderr_text()[log_before:]
    assert "unhandled error" not in logged and "Traceback" not in logged, logged[-2000:]
    assert live.client().get("/health")["status"] == "ok"
