"""``make demo`` narrates the session in sentences, not in Python's notation for its data."""

from __future__ import annotations

from gridd.demo import describe


def test_the_demo_says_where_the_session_started_and_why_it_stopped_in_words() -> None:
    started = describe(
        "session.started", {"featureBranch": "demo-feature", "maxAgents": 3, "budgetUsd": None}
    )
    assert started == "session started on demo-feature, at most 3 agents"
    stopped = describe("session.stopped", {"reason": "no_work", "force": False})
    assert stopped == "session stopped (no_work: no work was left for agents)"
    for line in (started, stopped):
        assert "{" not in line and "'" not in line
