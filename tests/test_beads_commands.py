"""Beads become tasks through the same commands as ``POST /tasks`` (``Commands.
create_from_source``): the same validation and the same defaults (``maxAttempts``). A bead
gridd cannot take as it is (a hostile id, a title with control characters) is refused with a
``beads.error`` report, once, and never inserted raw. Against the strict ``bd`` stand-in."""

from __future__ import annotations

from pathlib import Path

from tests.support.daemons import running_daemon
from tests.support.sse import event_log
from tests.support.waits import wait_for
from tests.test_beads import bd_calls, bead, setup_beads


def test_a_bead_with_a_hostile_id_or_an_invalid_title_is_refused_and_reported_once(
    repo: Path,
) -> None:
    setup_beads(
        repo,
        [
            bead("bd-ok"),
            bead("bd-nul", title="evil\x00title"),
            bead("bd-esc", title="colour \x1b[31m me"),
            bead("../escape"),
            bead("-rf"),
        ],
        extra="\n[scheduler]\nmax_attempts = 7\nmax_sessions = 9\n",
    )
    with running_daemon(repo) as d:
        c = d.client()
        wait_for(lambda: [t["id"] for t in c.get("/tasks")] == ["bd-ok"], timeout=20)
        task = c.get("/tasks/bd-ok")
        # the defaults a task gets through the commands, not the model's own
        assert (task["maxAttempts"], task["maxSessions"]) == (7, 9)
        assert task["status"] == "ready" and task["title"] == "Bead bd-ok"
        # a few more syncs see the same bad beads: still one report each
        readies = sum(1 for call in bd_calls(repo) if call[0] == "ready")
        wait_for(
            lambda: sum(1 for call in bd_calls(repo) if call[0] == "ready") >= readies + 3,
            timeout=20,
        )
        refused = {
            e.data["beadId"]: e.data
            for e in event_log(c, types={"beads.error"})
            if "beadId" in e.data
        }
        reports = [e for e in event_log(c, types={"beads.error"}) if "beadId" in e.data]
        assert sorted(refused) == ["-rf", "../escape", "bd-esc", "bd-nul"]
        assert len(reports) == 4
        for data in refused.values():
            assert data["permanent"] is True and data["retryInSeconds"] is None
            assert data["code"] == "invalid_task"
        assert "title" in refused["bd-nul"]["error"]
        assert "id" in refused["../escape"]["error"]
        assert [t["id"] for t in c.get("/tasks")] == ["bd-ok"]
