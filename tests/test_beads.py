"""The beads source against a fake ``bd`` that follows the real CLI's contract."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gridd.sources.beads import BdError, bead_task_fields, mirror_args, parse_ready
from tests.helpers import running_daemon, wait_for

FAKE_BD = Path(__file__).parent / "fakes" / "bd"


def bead(bead_id: str, **extra: object) -> dict[str, object]:
    return {
        "id": bead_id,
        "title": f"Bead {bead_id}",
        "description": "do the thing",
        "status": "open",
        "priority": 1,
        "issue_type": "task",
        "labels": [],
        "dependent_count": None,
        "created_at": "2026-11-01T00:00:00Z",
        "updated_at": "2026-11-01T00:00:00Z",
        **extra,
    }


def setup_beads(repo: Path, issues: list[dict[str, object]], mode: str = "ok") -> None:
    (repo / ".beads").mkdir()
    (repo / ".beads" / "fake-bd.json").write_text(json.dumps({"mode": mode, "issues": issues}))
    (repo / ".grid").mkdir(exist_ok=True)
    (repo / ".grid" / "config.toml").write_text(
        "[beads]\nenabled = true\n"
        f"command = [{json.dumps(sys.executable)}, {json.dumps(str(FAKE_BD))}]\n"
        "poll_seconds = 0.2\n"
    )


def bd_calls(repo: Path) -> list[list[str]]:
    log = repo / ".beads" / "fake-bd.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_parse_ready_is_lenient_about_drifting_fields() -> None:
    out = json.dumps([bead("a", priority=None, labels=None, extra_new_field=[1]), 42, {"no": "id"}])
    beads, warnings = parse_ready(out)
    assert [b["id"] for b in beads] == ["a"]
    assert len(warnings) == 2
    fields = bead_task_fields(beads[0])
    assert fields["priority"] == 2 and fields["labels"] == []
    assert "do the thing" in fields["prompt"]


def test_parse_ready_rejects_garbage_with_a_clear_error() -> None:
    with pytest.raises(BdError, match="not JSON"):
        parse_ready("<html>")
    assert parse_ready("[]") == ([], [])
    assert parse_ready("null") == ([], [])


def test_mirror_args_map_gridd_statuses_to_bd_commands() -> None:
    assert mirror_args("x", "review") == ["update", "x", "--status", "review"]
    assert mirror_args("x", "done") == ["close", "x"]
    assert mirror_args("x", "failed") == ["update", "x", "--add-label", "blocked"]
    assert mirror_args("x", "ready") is None


def test_beads_are_claimed_before_spawn_and_a_lost_claim_spawns_nothing(repo: Path) -> None:
    setup_beads(repo, [bead("bd-1"), bead("bd-2"), bead("bd-race", race=True)])
    with running_daemon(repo, env={"GRID_EXAMPLE_DELAY": "0"}) as d:
        c = d.client()
        wait_for(lambda: len(c.get("/tasks")) == 3, timeout=20, message="beads imported")
        c.post("/session/start", {"featureBranch": "beads-feature", "maxAgents": 3})

        def settled() -> bool:
            by_id = {t["id"]: t for t in c.get("/tasks")}
            return (
                by_id["bd-1"]["status"] == "review"
                and by_id["bd-2"]["status"] == "review"
                and by_id["bd-race"]["status"] == "cancelled"
            )

        wait_for(settled, timeout=60, message="beads worked and the race lost")
        spawned = [
            e.data["taskId"] for e in c.events(since=0, types=["agent.spawned"], read_timeout=1)
        ]
        assert sorted(spawned) == ["bd-1", "bd-2"]
        calls = bd_calls(repo)
        claims = [call[1] for call in calls if call[:1] == ["update"] and "--claim" in call]
        assert sorted(claims) == ["bd-1", "bd-2", "bd-race"]
        assert all(call[-2:] == ["--limit", "0"] for call in calls if call[0] == "ready")
        wait_for(
            lambda: ["update", "bd-1", "--status", "review"] in bd_calls(repo),
            timeout=20,
            message="review mirrored to bd",
        )
        c.post("/tasks/bd-1/approve")
        wait_for(lambda: ["close", "bd-1"] in bd_calls(repo), timeout=20, message="bd close")
        lost = list(c.events(since=0, types=["beads.claim_lost"], read_timeout=1))
        assert [e.data["taskId"] for e in lost] == ["bd-race"]
        c.post("/session/stop")


def test_bd_garbage_output_is_an_event_and_a_retry_not_a_crash(repo: Path) -> None:
    setup_beads(repo, [bead("bd-1")], mode="garbage")
    with running_daemon(repo) as d:
        c = d.client()
        errors = wait_for(
            lambda: list(c.events(since=0, types=["beads.error"], read_timeout=1)),
            timeout=20,
            message="beads.error event",
        )
        assert "not JSON" in errors[0].data["error"]
        assert errors[0].data["retryInSeconds"] > 0
        # bd recovers: the task appears on a later poll, the daemon never went away.
        db = json.loads((repo / ".beads" / "fake-bd.json").read_text())
        db["mode"] = "ok"
        (repo / ".beads" / "fake-bd.json").write_text(json.dumps(db))
        wait_for(lambda: [t["id"] for t in c.get("/tasks")] == ["bd-1"], timeout=30)
        assert d.proc.poll() is None
