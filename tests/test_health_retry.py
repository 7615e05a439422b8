"""Health and restarts with real agents: a command that never shows life fails its launch
once (no retry storm), silence is a stall that new life clears, long silence is killed and
retried, failures back off on a monotonic clock and flapping ends in ``failed``; a retry
reads what went wrong before, and a task continues over several sessions up to its limit."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from gridd.model import Task, TaskStatus
from gridd.plan import Observed, StartTask, plan
from gridd.pool import Roster
from gridd.settings import parse_settings
from tests.support.api import scheduler_starts, wait_task_status
from tests.support.daemons import core_daemon
from tests.support.processes import process_gone
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log, wait_for_events
from tests.support.waits import wait_for


def runs(report_dir: Path, task_id: str) -> list[dict[str, object]]:
    """What each run of ``beats.py`` reported about itself, in order."""
    path = report_dir / f"{task_id}.runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def beats(report_dir: Path, *actions: str, **profile: object) -> dict[str, object]:
    return {"command": agent_command("beats.py", str(report_dir), *actions), **profile}


# -- launch failure, stalls ----------------------------------------------------------------------


def test_a_command_that_never_shows_life_fails_its_launch_once_with_a_hint(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        agents={"mute": {"command": ["sleep", "60"], "launch_grace_seconds": 1.0}},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "mute", "title": "never speaks", "agent": "mute"})
        c.post("/session/start", {"maxAgents": 1})
        launch = wait_for_events(c, {"agent.launch_failed"}, 1)[0].data
        assert launch["taskId"] == "mute"
        assert "PATH" in launch["hint"] and "authenticated" in launch["hint"]
        assert "1s" in launch["reason"]
        task = wait_task_status(c, "mute", "blocked")
        assert "launch failed" in str(task["error"])
        pid = int(event_log(c, types={"agent.spawned"})[0].data["pid"])
        wait_for(lambda: process_gone(pid), timeout=10, message="the silent command to end")
        assert scheduler_starts(c) == []  # a blocked launch failure is not retried
        assert len(event_log(c, types={"agent.spawned"})) == 1
        assert c.get("/tasks/mute")["status"] == "blocked"


def test_silence_is_a_stall_that_new_output_clears(repo: Path, tmp_path: Path) -> None:
    write_core_config(
        repo,
        agents={
            "pause": beats(tmp_path, "say:thinking", "sleep:2.5", "say:back", stall_seconds=0.8)
        },
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "pause", "title": "pauses", "agent": "pause"})
        c.post("/session/start", {"maxAgents": 1})
        stalled = wait_for_events(c, {"agent.stalled"}, 1)[0]
        assert stalled.data["taskId"] == "pause" and stalled.data["silentSeconds"] >= 0.8
        agent_id = stalled.data["agentId"]
        recovered = wait_for_events(c, {"agent.recovered"}, 1)[0]
        assert recovered.data["agentId"] == agent_id and recovered.id > stalled.id
        wait_task_status(c, "pause", "review")
        assert c.get(f"/agents/{agent_id}")["stalled"] is False
        assert len(event_log(c, types={"agent.spawned"})) == 1


def test_long_silence_is_killed_and_retried(repo: Path, tmp_path: Path) -> None:
    write_core_config(
        repo,
        agents={"hang": beats(tmp_path, "say:started", "once:sleep:120", "say:finished")},
        scheduler={"stall_seconds": 0.5, "stall_kill_seconds": 1.5},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "hang", "title": "goes quiet", "agent": "hang"})
        c.post("/session/start", {"maxAgents": 1})
        failed = wait_for_events(c, {"agent.failed"}, 1, timeout=30)[0].data
        assert "stalled" in failed["error"] and failed["willRetry"] is True
        first = runs(tmp_path, "hang")[0]
        wait_for(lambda: process_gone(int(first["pid"])), timeout=10)
        wait_task_status(c, "hang", "review")
        types = [e.type for e in event_log(c, types={"agent.stalled", "agent.failed"})]
        assert types == ["agent.stalled", "agent.failed"]
        assert [r["attempt"] for r in runs(tmp_path, "hang")] == [1, 2]


# -- restart policy --------------------------------------------------------------------------------


def test_flapping_fails_the_task_before_its_attempts_run_out(repo: Path, tmp_path: Path) -> None:
    write_core_config(
        repo,
        agents={"crash": beats(tmp_path, "say:crashing", "exit:3")},
        scheduler={"flap_failures": 2, "flap_window_seconds": 60},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "flap", "title": "crashes", "agent": "crash", "maxAttempts": 10})
        c.post("/session/start", {"maxAgents": 1})
        task = wait_task_status(c, "flap", "failed")
        assert "flapping" in str(task["error"]) and "code 3" in str(task["error"])
        assert task["attempts"] == 2
        failed = [e.data for e in event_log(c, types={"agent.failed"})]
        assert [f["willRetry"] for f in failed] == [True, False]
        assert scheduler_starts(c) == []  # failed for flapping: not started again
        assert len(event_log(c, types={"agent.spawned"})) == 2


def test_retries_back_off_and_read_the_previous_failure(repo: Path, tmp_path: Path) -> None:
    write_core_config(
        repo,
        agents={"flaky": beats(tmp_path, "lines:250", "say:giving up", "exit:4")},
        scheduler={"backoff_seconds": 0.6, "backoff_max_seconds": 30},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post(
            "/tasks",
            {"id": "flaky", "title": "Fix the flaky thing", "prompt": "fix it", "agent": "flaky"},
        )
        c.post("/session/start", {"maxAgents": 1})
        wait_task_status(c, "flaky", "failed", timeout=40)
        attempts = runs(tmp_path, "flaky")
        failed = [e.data for e in event_log(c, types={"agent.failed"})]
    assert [r["attempt"] for r in attempts] == [1, 2, 3]
    # Spaced by the backoff at least (0.6 s, then doubled), measured on the monotonic clock.
    gaps = [float(b["monotonic"]) - float(a["monotonic"]) for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.6 and gaps[1] >= 1.2, gaps
    # The first attempt has no previous failure; each retry reads the one before it.
    assert attempts[0]["previousFailure"] is None
    for n, run in enumerate(attempts[1:], start=1):
        text = str(run["previousFailure"])
        assert text == Path(str(failed[n - 1]["failureFile"])).read_text()
        assert f"# Attempt {n} of task flaky failed" in text
        assert "- exit code: 4" in text
        assert "fix it" in text  # what was tried
        tail = text.split("```")[1].strip().splitlines()
        assert tail == [f"line {i}" for i in range(52, 251)] + ["giving up"]


def test_backoff_doubles_from_its_base_up_to_its_ceiling() -> None:
    settings = parse_settings({"scheduler": {"backoff_seconds": 2, "backoff_max_seconds": 30}})
    roster = Roster(settings.scheduler)
    assert [roster.backoff(n) for n in range(1, 8)] == [2, 4, 8, 16, 30, 30, 30]
    assert roster.backoff(0) == 2


@pytest.mark.parametrize("now", [100.0, 104.9, 105.0, 200.0])
def test_the_plan_starts_a_task_only_once_its_monotonic_backoff_has_passed(now: float) -> None:
    task = Task(id="t", title="t", status=TaskStatus.READY)
    observed = Observed(
        now=now,
        session_started=True,
        max_agents=2,
        tasks=[task],
        agents=[],
        not_before={"t": 105.0},
    )
    starts = [a for a in plan(observed) if isinstance(a, StartTask)]
    assert starts == ([StartTask("t", "example")] if now >= 105.0 else [])


# -- session chaining ---------------------------------------------------------------------------------


def test_a_task_continues_over_sessions_with_the_summary_until_max_sessions(
    repo: Path, tmp_path: Path
) -> None:
    summary_beat = 'beat:{"status": "working", "message": "summary of session {session}"}'
    write_core_config(
        repo,
        agents={
            "tempfail": beats(tmp_path, "note:{prompt}", summary_beat, "exit:75"),
            "asks": beats(
                tmp_path,
                "note:{prompt}",
                'beat:{"status": "continue", "message": "asked on session {session}"}',
            ),
        },
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post(
            "/tasks",
            [
                {
                    "id": "long",
                    "title": "long",
                    "prompt": "do it",
                    "agent": "tempfail",
                    "maxSessions": 3,
                },
                {
                    "id": "chat",
                    "title": "chat",
                    "prompt": "talk",
                    "agent": "asks",
                    "maxSessions": 2,
                },
            ],
        )
        c.post("/session/start", {"maxAgents": 2})
        long = wait_task_status(c, "long", "blocked", timeout=40)
        chat = wait_task_status(c, "chat", "blocked", timeout=40)
        continued = event_log(c, types={"agent.continued"})
        spawned = event_log(c, types={"agent.spawned"})
    assert "maxSessions" in str(long["error"]) and "3 session" in str(long["error"])
    assert "2 session" in str(chat["error"])
    for task_id, count, said in (
        ("long", 3, "summary of session"),
        ("chat", 2, "asked on session"),
    ):
        reports = runs(tmp_path, task_id)
        assert [r["session"] for r in reports] == list(range(1, count + 1))
        assert [r["attempt"] for r in reports] == [1] * count  # continuing is not retrying
        assert len({r["cwd"] for r in reports}) == 1
        assert {r["branch"] for r in reports} == {f"grid/{task_id}"}
        prompts = [str(r["argv"][2])[len("note:") :] for r in reports]
        assert "previous session" not in prompts[0]
        for n, prompt in enumerate(prompts[1:], start=2):
            assert f"session {n} of {count}" in prompt
            assert f"{said} {n - 1}" in prompt
        mine = [e.data for e in continued if e.data["taskId"] == task_id]
        assert [m["session"] for m in mine] == list(range(1, count))
        assert [s.data["session"] for s in spawned if s.data["taskId"] == task_id] == list(
            range(1, count + 1)
        )


def test_a_command_that_does_not_exist_blocks_its_task_at_once_with_the_reason(
    repo: Path,
) -> None:
    write_core_config(
        repo, agents={"ghost": {"command": ["gridd-no-such-command-xyz", "{prompt}"]}}
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "ghost", "title": "never runs", "agent": "ghost"})
        c.post("/tasks/ghost/start")
        task = wait_task_status(c, "ghost", "blocked", timeout=30)
        assert task["error"] == (
            "cannot start the agent command: 'gridd-no-such-command-xyz' not found on PATH"
        )
        assert len(event_log(c, types={"agent.spawned"})) == 1  # no retry storm
