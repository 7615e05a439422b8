"""The read-only surface every client starts with: /openapi.json, /version, /health, /state."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from typing import Any

from gridd import API_VERSION, __version__
from tests.support.daemons import DaemonProc


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_openapi_document_describes_the_served_endpoints(live: DaemonProc) -> None:
    doc = live.client().get("/openapi.json")
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"] == "gridd"
    assert doc["info"]["version"] == __version__
    paths = doc["paths"]
    for path, method in [
        ("/health", "get"),
        ("/version", "get"),
        ("/state", "get"),
        ("/events", "get"),
        ("/shutdown", "post"),
        ("/openapi.json", "get"),
    ]:
        assert method in paths[path], f"{method.upper()} {path} missing"
        op = paths[path][method]
        assert op["summary"]
        assert "200" in op["responses"] or "202" in op["responses"]
    assert "text/event-stream" in paths["/events"]["get"]["responses"]["200"]["content"]
    params = {p["name"] for p in paths["/events"]["get"]["parameters"]}
    assert {"since", "types"} <= params
    schemas = doc["components"]["schemas"]
    assert {"RepoState", "VersionInfo", "Health", "ErrorBody"} <= set(schemas)
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/")
        assert ref.rsplit("/", 1)[1] in schemas, f"dangling $ref {ref}"
    # every served path answers something other than 404 to its documented method
    for path, ops in paths.items():
        if "{" in path or path in {"/events", "/shutdown"}:
            continue
        if "get" in ops:
            content = ops["get"]["responses"]["200"].get("content", {"application/json": {}})
            if "application/json" in content:
                live.client().get(path)
            else:
                live.client().get_text(path)  # /metrics: text, not JSON


def test_openapi_schema_uses_wire_names(live: DaemonProc) -> None:
    schemas = live.client().get("/openapi.json")["components"]["schemas"]
    assert "pendingQuestions" in schemas["RepoState"]["properties"]
    assert "apiVersion" in schemas["VersionInfo"]["properties"]


def test_version_reports_versions_pid_and_python(live: DaemonProc) -> None:
    body = live.client().get("/version")
    assert body["version"] == __version__
    assert body["apiVersion"] == API_VERSION
    assert body["pid"] == live.proc.pid
    assert body["python"] == platform.python_version()


def test_health_is_ok_with_pid_and_uptime(live: DaemonProc) -> None:
    body = live.client().get("/health")
    assert body["status"] == "ok"
    assert body["pid"] == live.proc.pid
    assert body["uptime"] >= 0


def test_state_has_the_repo_state_shape_in_camel_case(live: DaemonProc) -> None:
    body = live.client().get("/state")
    assert {"session", "tasks", "agents", "pendingQuestions", "stats", "daemon"} <= set(body)
    assert isinstance(body["tasks"], list)
    assert isinstance(body["agents"], list)
    assert isinstance(body["pendingQuestions"], list)
    daemon = body["daemon"]
    assert daemon["version"] == __version__
    assert daemon["pid"] == live.proc.pid
    assert daemon["uptime"] >= 0
    assert daemon["lastEventId"] >= 1
    assert daemon["workspace"] == str(live.root.resolve())
    assert not any("_" in key for key in _keys(body)), "snake_case leaked onto the wire"


def _keys(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key
            yield from _keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from _keys(item)
