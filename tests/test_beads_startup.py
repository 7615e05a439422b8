"""Known before served (#22): the daemon answers ``/health`` 200 only once its first
``bd ready`` has landed, so a bead that existed before the start can be started the instant
the daemon answers; an id gridd does not know is asked of bd once before the 404; and a
failing bd is served through, with ``/health`` saying beads is degraded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gridd.client import GridClient
from gridd.errors import DaemonUnreachable, NotFound
from tests.support.daemons import running_daemon
from tests.support.repos import make_repo, remove_repo
from tests.support.waits import wait_for
from tests.test_beads import bd_calls, bead, edit_bd_db, setup_beads

#: No agent is started: the scheduler only acts on POST /scheduler/step.
STEP_MODE = "\n[scheduler]\nstep_mode = true\n"


def first_health(sock: Path) -> dict[str, object]:
    """``/health`` as soon as it first answers 200."""

    def answered() -> dict[str, object] | None:
        try:
            with GridClient(sock, timeout=10.0) as c:
                health: dict[str, object] = c.get("/health")
        except DaemonUnreachable:
            return None
        return health if health.get("status") == "ok" else None

    found: dict[str, object] = wait_for(
        answered, timeout=30, interval=0.005, message="/health to answer 200 ok"
    )
    return found


def test_a_bead_present_before_start_can_be_started_the_instant_health_answers() -> None:
    for attempt in range(20):
        repo = make_repo()
        try:
            setup_beads(repo, [bead("bd-1")], extra=STEP_MODE)
            with running_daemon(repo, wait=False) as daemon:
                first_health(daemon.sock)
                with daemon.client() as c:
                    started = c.post("/tasks/bd-1/start")
                assert started["status"] == "working", f"attempt {attempt + 1}: {started}"
        finally:
            remove_repo(repo)


def test_an_unknown_id_is_asked_of_bd_once_before_the_404(repo: Path) -> None:
    # No poll, no watch: only the first read, and what a start asks for, reach bd.
    setup_beads(repo, [bead("bd-1")], "ok", "watch = false\n" + STEP_MODE, poll_seconds=0)
    with running_daemon(repo) as daemon:
        c = daemon.client()
        assert [t["id"] for t in c.get("/tasks")] == ["bd-1"]
        edit_bd_db(repo, lambda db: db["issues"].append(bead("bd-2")))
        assert c.post("/tasks/bd-2/start")["status"] == "working"
        reads = len([call for call in bd_calls(repo) if call[:1] == ["ready"]])
        with pytest.raises(NotFound) as info:
            c.post("/tasks/bd-nothing/start")
        assert info.value.code == "task_not_found"
        after = len([call for call in bd_calls(repo) if call[:1] == ["ready"]])
        assert after == reads + 1  # asked once, then the 404


def test_a_failing_bd_is_served_through_and_health_says_beads_is_degraded(repo: Path) -> None:
    setup_beads(repo, [bead("bd-1")], mode="fail", extra=STEP_MODE)
    with running_daemon(repo, wait=False) as daemon:
        c = daemon.client()
        health = wait_for(
            lambda: _health_or_none(c), timeout=30, message="/health to answer", interval=0.02
        )
        assert health["status"] == "degraded" and "beads" in health["degraded"]
        assert any(str(w).startswith("beads: ") for w in health["warnings"])
        edit_bd_db(repo, lambda db: db.update(mode="ok"))
        wait_for(lambda: c.get("/health")["status"] == "ok", timeout=30, message="bd recovered")
        assert [t["id"] for t in c.get("/tasks")] == ["bd-1"]


def _health_or_none(c: GridClient) -> dict[str, object] | None:
    try:
        health: dict[str, object] = c.get("/health")
    except DaemonUnreachable:
        return None
    return health


def test_a_bd_that_never_answers_delays_serving_only_for_the_bounded_wait(repo: Path) -> None:
    setup_beads(repo, [bead("bd-1")], extra=STEP_MODE)  # waits beads.first_sync_seconds, 3 s
    hang = Path(repo / ".beads" / "hang.py")
    hang.write_text("import time\ntime.sleep(120)\n")
    config = repo / ".grid" / "config.toml"
    text = config.read_text()
    start = text.index("command = ")
    end = text.index("\n", start)
    config.write_text(text[:start] + f'command = ["{sys.executable}", "{hang}"]' + text[end:])
    with running_daemon(repo) as daemon:  # answers /health 200 within the helper's 15 s
        health = daemon.client().get("/health")
        assert health["status"] == "degraded" and "beads" in health["degraded"]
        assert "beads: the first 'bd ready' has not answered yet" in health["warnings"]
