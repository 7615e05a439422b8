"""``/openapi.json`` says what the server does: schemathesis generates requests from the
document the daemon serves, sends them over its Unix socket, and checks every answer
against the same document. No answer may be a 5xx, every status must be documented, and
every body must match the documented schema and content type.

Bounded in time: a fixed number of examples per operation, no shrinking, no example
database. ``POST /shutdown`` (it ends the daemon) and ``GET /events`` (a stream that never
ends) are left out. ``positive_data_acceptance`` is left out too: some rules (no ``..`` in
an id, git's ref-name rules, control characters in text) are checked by the server but are
not expressed in the JSON Schema, so a schema-valid request can rightly get a 422.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import positive_data_acceptance

from tests.support.daemons import core_daemon
from tests.support.repos import agent_command, write_core_config

EXAMPLES = 12
SKIPPED = {("POST", "/shutdown"), ("GET", "/events")}


def _send(client: httpx.Client, case: Any) -> httpx.Response:
    kwargs = case.as_transport_kwargs(base_url="http://gridd")
    if "data" in kwargs:
        kwargs["content"] = kwargs.pop("data")
    kwargs.pop("cookies", None)
    return client.request(**kwargs)


def test_every_answer_to_generated_requests_matches_the_served_openapi_and_none_is_a_5xx(
    repo: Path,
) -> None:
    write_core_config(
        repo,
        agents={"work": {"command": agent_command("trivial.py", "0.1")}},
        scheduler={"default_agent": "work"},
    )
    with core_daemon(repo) as daemon:
        transport = httpx.HTTPTransport(uds=str(daemon.sock))
        with httpx.Client(transport=transport, base_url="http://gridd", timeout=15) as client:
            # Some state for the generated requests to meet: a task, a plan, a session.
            client.post("/tasks", json={"id": "seed", "title": "a task to find"})
            schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
            statuses: Counter[int] = Counter()
            failures: dict[str, str] = {}
            operations = 0
            for result in schema.get_all_operations():
                operation = result.ok()
                key = (operation.method.upper(), operation.path)
                if key in SKIPPED:
                    continue
                operations += 1
                name = f"{key[0]} {key[1]}"

                @settings(
                    max_examples=EXAMPLES,
                    deadline=None,
                    database=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=operation.as_strategy())
                def check(case: Any) -> None:
                    response = _send(client, case)
                    statuses[response.status_code] += 1
                    try:
                        case.validate_response(response, excluded_checks=[positive_data_acceptance])
                    except BaseException as failure:  # schemathesis raises a FailureGroup
                        if isinstance(failure, KeyboardInterrupt):
                            raise
                        failures.setdefault(name, str(failure)[:2000])  # noqa: B023

                check()
            assert client.get("/health").status_code == 200  # the daemon survived it all
        log = daemon.stderr_text()
    assert operations >= 25  # every documented operation but the two skipped was exercised
    assert sum(statuses.values()) >= operations * 2
    assert not [s for s in statuses if s >= 500], statuses
    assert failures == {}, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    # Requests racing the agents (stops, kills, cancels as a run ends) are ordinary: none may
    # ask the state machine for a move it refuses, nor fail a run's finish.
    bugs = [ln for ln in log.splitlines() if "BUG:" in ln or "finishing agent" in ln]
    assert bugs == [], bugs


def test_the_fuzz_check_catches_an_undocumented_status(repo: Path) -> None:
    """The check above can fail: an answer the document does not list is reported."""
    with core_daemon(repo) as daemon:
        transport = httpx.HTTPTransport(uds=str(daemon.sock))
        with httpx.Client(transport=transport, base_url="http://gridd", timeout=15) as client:
            document = client.get("/openapi.json").json()
            # Pretend GET /tasks/{task_id} only ever answers 200: a 404 must be flagged.
            document["paths"]["/tasks/{task_id}"]["get"]["responses"].pop("4XX")
            operation = schemathesis.openapi.from_dict(document)["/tasks/{task_id}"]["GET"]
            case = operation.Case(path_parameters={"task_id": "no-such-task"})
            response = _send(client, case)
            assert response.status_code == 404
            with pytest.raises(BaseException, match="Undocumented status code"):
                case.validate_response(response, excluded_checks=[positive_data_acceptance])
