"""gridctl, end to end: the real CLI as a subprocess against real, detached gridd processes.

Every test that may start a daemon uses the ``ws`` fixture, which stops it afterwards
(``gridctl daemon stop``, then SIGKILL by pid for anything still serving the repository).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console

from gridd.cli import render, render_events, render_status
from gridd.cli.daemonctl import START_TIMEOUT
from gridd.client import SSEEvent
from gridd.errors import GriddError
from gridd.lockholder import flock_holder
from gridd.model import (
    Agent,
    AgentStatus,
    DaemonInfo,
    Question,
    RepoState,
    SessionState,
    Stats,
    Task,
    TaskStatus,
)
from tests.support.api import socket_answers
from tests.support.cli import GRIDCTL, gridctl
from tests.support.cli import GRIDCTL_ENV as ENV
from tests.support.daemons import DaemonProc
from tests.support.processes import daemons_serving
from tests.support.waits import wait_for


def pid_file(root: Path) -> Path:
    return root / ".grid" / "gridd.pid"


def sock(root: Path) -> Path:
    return root / ".grid" / "gridd.sock"


def events_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_status_prints_a_readable_summary(daemon: DaemonProc) -> None:
    result = gridctl(daemon.root, "--no-start", "status")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"pid {daemon.proc.pid}" in out
    assert str(daemon.root) in out
    assert "session not started" in out
    assert "tasks (0): none" in out  # counted by status once there are some
    assert "no agents" in out
    assert "no pending questions" in out
    assert "last event #1" in out
    assert "Traceback" not in result.stderr


def test_status_json_is_the_raw_state_document(daemon: DaemonProc) -> None:
    result = gridctl(daemon.root, "status", "--json", "--no-start")
    assert result.returncode == 0, result.stderr
    state = json.loads(result.stdout)
    assert set(state) >= {"session", "tasks", "agents", "pendingQuestions", "stats", "daemon"}
    assert state["daemon"]["pid"] == daemon.proc.pid
    assert state["daemon"]["lastEventId"] >= 1


def test_daemon_start_detaches_and_stop_removes_socket_and_pid_file(ws: Path) -> None:
    started = gridctl(ws, "daemon", "start")
    assert started.returncode == 0, started.stderr
    assert "started" in started.stdout
    assert "gridd.out" in started.stdout
    assert socket_answers(sock(ws))
    pid = int(pid_file(ws).read_text())
    assert f"pid {pid}" in started.stdout
    # Detached: its own session, and it outlived the gridctl that launched it.
    assert os.getsid(pid) == pid
    assert psutil.Process(pid).is_running()

    stopped = gridctl(ws, "daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert f"was pid {pid}" in stopped.stdout
    assert not sock(ws).exists()
    assert not pid_file(ws).exists()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_daemon_start_when_running_exits_0_without_a_second_daemon(ws: Path) -> None:
    assert gridctl(ws, "daemon", "start").returncode == 0
    pid = int(pid_file(ws).read_text())
    again = gridctl(ws, "daemon", "start")
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout
    assert [p.pid for p in daemons_serving(ws)] == [pid]


def test_daemon_restart_replaces_the_process(ws: Path) -> None:
    assert gridctl(ws, "daemon", "start").returncode == 0
    before = int(pid_file(ws).read_text())
    result = gridctl(ws, "daemon", "restart")
    assert result.returncode == 0, result.stderr
    after = int(pid_file(ws).read_text())
    assert after != before
    assert socket_answers(sock(ws))
    assert [p.pid for p in daemons_serving(ws)] == [after]


def test_restart_and_upgrade_refuse_a_bad_config_before_stopping_the_daemon(ws: Path) -> None:
    assert gridctl(ws, "daemon", "start").returncode == 0
    pid = int(pid_file(ws).read_text())
    (ws / ".grid" / "config.toml").write_text("[daemon]\nlog_max_bytes = 100\n")
    for action in ("restart", "upgrade"):
        refused = gridctl(ws, "daemon", action)
        assert refused.returncode == 1, refused.stdout
        assert "'daemon.log_max_bytes'" in refused.stderr
        assert f"Nothing was stopped: fix it, then run the {action} again" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert [p.pid for p in daemons_serving(ws)] == [pid]  # still serving, untouched
    (ws / ".grid" / "config.toml").write_text("[daemon]\nlog_max_bytes = 8192\n")
    assert gridctl(ws, "daemon", "restart").returncode == 0
    assert [p.pid for p in daemons_serving(ws)] != [pid]


def test_daemon_start_and_status_say_when_the_daemon_runs_degraded(ws: Path) -> None:
    grid = ws / ".grid"
    grid.mkdir(mode=0o700, exist_ok=True)
    (grid / "gridd.db").write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
    started = gridctl(ws, "daemon", "start")
    assert started.returncode == 0, started.stderr
    status = gridctl(ws, "daemon", "status")
    for out in (started.stdout, status.stdout):
        assert "  degraded: state database was unreadable" in out
        assert "moved aside to" in out and "gridctl doctor" in out
    assert gridctl(ws, "daemon", "stop").returncode == 0
    assert gridctl(ws, "daemon", "start").returncode == 0
    assert "degraded" not in gridctl(ws, "daemon", "status").stdout  # a fresh start is ok


def test_concurrent_auto_starts_leave_exactly_one_daemon(ws: Path) -> None:
    procs = [
        subprocess.Popen(
            [*GRIDCTL, "status", "--json"],
            cwd=ws,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=30) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    pids = {json.loads(out)["daemon"]["pid"] for out, _ in outputs}
    assert len(pids) == 1
    assert [p.pid for p in daemons_serving(ws)] == list(pids)


def test_daemon_start_recovers_after_a_crash(ws: Path) -> None:
    assert gridctl(ws, "daemon", "start").returncode == 0
    crashed = int(pid_file(ws).read_text())
    os.kill(crashed, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(crashed), message="the killed gridd to go")
    assert sock(ws).exists(), "a SIGKILLed daemon leaves its socket behind"

    assert gridctl(ws, "daemon", "status").returncode == 3
    restarted = gridctl(ws, "daemon", "start")
    assert restarted.returncode == 0, restarted.stderr
    assert int(pid_file(ws).read_text()) != crashed
    assert socket_answers(sock(ws))


def test_daemon_status_exits_3_when_not_running_and_0_when_running(ws: Path) -> None:
    down = gridctl(ws, "daemon", "status")
    assert down.returncode == 3
    assert "not running" in down.stdout
    assert not sock(ws).exists(), "daemon status must not start the daemon"

    assert gridctl(ws, "daemon", "start").returncode == 0
    up = gridctl(ws, "daemon", "status")
    assert up.returncode == 0, up.stderr
    assert f"pid {pid_file(ws).read_text().strip()}" in up.stdout
    assert "version" in up.stdout


def test_daemon_stop_when_not_running_exits_0(ws: Path) -> None:
    result = gridctl(ws, "daemon", "stop")
    assert result.returncode == 0, result.stderr
    assert "not running" in result.stdout


@pytest.mark.parametrize("command", [["status"], ["events"], ["status", "--json"]])
def test_no_start_without_a_daemon_exits_3_and_says_how_to_start(
    ws: Path, command: list[str]
) -> None:
    result = gridctl(ws, "--no-start", *command)
    assert result.returncode == 3
    assert "gridctl daemon start" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not daemons_serving(ws)


def test_status_starts_the_daemon_when_it_is_not_running(ws: Path) -> None:
    result = gridctl(ws, "status", "--json")
    assert result.returncode == 0, result.stderr
    state = json.loads(result.stdout)  # the note about starting goes to stderr
    assert "started gridd" in result.stderr
    assert state["daemon"]["pid"] == int(pid_file(ws).read_text())
    assert socket_answers(sock(ws))


def test_daemon_start_failure_shows_exit_status_and_output(ws: Path) -> None:
    grid = ws / ".grid"
    grid.mkdir(mode=0o700)
    (grid / "config.toml").write_text("[daemon]\nlog_levle = 'DEBUG'\n")
    result = gridctl(ws, "daemon", "start")
    assert result.returncode == 1
    assert "exited during startup with status 1" in result.stderr
    assert "log_levle" in result.stderr  # the daemon's own complaint, from gridd.out
    assert "gridd.out" in result.stderr
    assert "Traceback" not in result.stderr


def test_daemon_start_refused_by_a_lock_holder_fails_at_once_naming_it(ws: Path) -> None:
    # The lock file names a live process that is not the one holding the lock (a reused
    # pid): gridctl does not wait for it to come up as a daemon, it says who holds the lock.
    if shutil.which("flock") is None:
        pytest.skip("flock (util-linux) is not installed")
    grid = ws / ".grid"
    grid.mkdir(mode=0o700)
    lock = grid / "gridd.lock"
    lock.touch(mode=0o600)
    bystander = subprocess.Popen(["sleep", "60"])
    holder = subprocess.Popen(["flock", str(lock), "sleep", "60"])
    try:
        wait_for(lambda: flock_holder(lock) == holder.pid, message="flock to hold it")
        lock.write_text(f"{bystander.pid}\n")
        started = time.monotonic()
        result = gridctl(ws, "daemon", "start")
        took = time.monotonic() - started
    finally:
        for proc in (holder, bystander):
            proc.kill()
            proc.wait()
    assert result.returncode == 1, result.stderr
    assert "exited during startup with status 1" in result.stderr
    assert f"pid {holder.pid} (flock {lock} sleep 60) holds .grid/gridd.lock" in result.stderr
    assert took < START_TIMEOUT, took  # not the wait for an answer that never comes


def test_events_prints_existing_events_and_resumes_with_since(ws: Path) -> None:
    assert gridctl(ws, "daemon", "start").returncode == 0
    assert gridctl(ws, "daemon", "restart").returncode == 0
    first = gridctl(ws, "events")
    assert first.returncode == 0, first.stderr
    seen = events_of(first.stdout)
    assert [e["type"] for e in seen] == ["daemon.started", "daemon.stopping", "daemon.started"]
    assert [e["id"] for e in seen] == sorted({e["id"] for e in seen})
    assert all(set(e) == {"id", "type", "data"} for e in seen)
    assert first.stdout.splitlines()[0].startswith('{"id":')  # compact

    assert gridctl(ws, "daemon", "restart").returncode == 0
    last = seen[-1]["id"]
    more = events_of(gridctl(ws, "events", "--since", str(last)).stdout)
    assert [e["type"] for e in more] == ["daemon.stopping", "daemon.started"]
    ids = [e["id"] for e in seen + more]
    assert ids == sorted(set(ids)), "resuming with --since must not repeat or skip events"
    assert ids == list(range(1, len(ids) + 1))

    nothing = gridctl(ws, "events", "--since", str(ids[-1]))
    assert nothing.returncode == 0
    assert nothing.stdout == ""


def test_events_types_filters_and_pretty_prints(ws: Path) -> None:
    assert gridctl(ws, "daemon", "start").returncode == 0
    assert gridctl(ws, "daemon", "restart").returncode == 0
    stopping = events_of(gridctl(ws, "events", "--types", "daemon.stopping").stdout)
    assert [e["type"] for e in stopping] == ["daemon.stopping"]
    both = events_of(gridctl(ws, "events", "--types", "daemon.stopping,daemon.started").stdout)
    assert len(both) == 3
    snapshots = gridctl(ws, "events", "--types", "state.snapshot")
    assert snapshots.returncode == 0
    assert snapshots.stdout == ""

    pretty = gridctl(ws, "events", "--pretty", "--types", "daemon.stopping")
    assert pretty.returncode == 0, pretty.stderr
    assert pretty.stdout.startswith("#2 daemon.stopping pid=")


def _read_lines(stream: Any, into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def _next_event(lines: queue.Queue[str], timeout: float = 15) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(lines.get(timeout=timeout))
    return event


def test_events_follow_survives_a_restart_and_exits_0_on_ctrl_c(ws: Path) -> None:
    assert gridctl(ws, "daemon", "start").returncode == 0
    follower = subprocess.Popen(
        [*GRIDCTL, "events", "--follow"],
        cwd=ws,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # PYTHONFAULTHANDLER: if it hangs, SIGABRT below makes it print where.
        env={**ENV, "PYTHONFAULTHANDLER": "1"},
        # A background child may inherit SIGINT as ignored; Ctrl-C is what we test.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert follower.stdout is not None and follower.stderr is not None
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_read_lines, args=(follower.stdout, lines), daemon=True).start()
        assert _next_event(lines)["id"] == 1
        assert gridctl(ws, "daemon", "restart").returncode == 0
        after = [_next_event(lines), _next_event(lines)]
        assert [(e["id"], e["type"]) for e in after] == [
            (2, "daemon.stopping"),
            (3, "daemon.started"),
        ]
        follower.send_signal(signal.SIGINT)
        try:
            status = follower.wait(15)
        except subprocess.TimeoutExpired:
            follower.send_signal(signal.SIGABRT)
            follower.wait(10)
            pytest.fail(f"gridctl events --follow ignored Ctrl-C:\n{follower.stderr.read()}")
        assert status == 0
        assert "Traceback" not in follower.stderr.read()
        assert lines.empty(), "no duplicates after reconnecting"
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def test_outside_a_git_repository_exits_1_with_a_clear_message() -> None:
    outside = Path(tempfile.mkdtemp(prefix="n", dir="/tmp"))
    try:
        result = subprocess.run(
            [*GRIDCTL, "status"],
            cwd=outside,
            capture_output=True,
            text=True,
            timeout=30,
            env={**ENV, "GIT_CEILING_DIRECTORIES": str(outside.parent)},
        )
        assert result.returncode == 1
        assert "not inside a git repository" in result.stderr
        assert result.stderr.startswith("gridctl: ")
        assert "Traceback" not in result.stderr
        assert not (outside / ".grid").exists()
    finally:
        outside.rmdir()


def test_workspace_option_works_before_and_after_the_command(ws: Path) -> None:
    elsewhere = Path("/")
    before = gridctl(ws, "--workspace", str(ws), "daemon", "status", cwd=elsewhere)
    after = gridctl(ws, "daemon", "status", "--workspace", str(ws), cwd=elsewhere)
    assert before.returncode == after.returncode == 3
    assert str(ws) in before.stdout
    assert str(ws) in after.stdout


@pytest.mark.parametrize(
    "argv",
    [[], ["frobnicate"], ["daemon"], ["daemon", "explode"], ["events", "--since", "-1"]],
    ids=["no-command", "unknown-command", "no-daemon-action", "bad-action", "negative-since"],
)
def test_bad_usage_exits_2(ws: Path, argv: list[str]) -> None:
    result = gridctl(ws, *argv)
    assert result.returncode == 2
    assert "usage:" in result.stderr
    assert not daemons_serving(ws)


def test_help_describes_every_flag(ws: Path) -> None:
    top = gridctl(ws, "--help").stdout
    for flag in ("--workspace", "--no-start", "--version", "status", "events", "daemon"):
        assert flag in top
    events = gridctl(ws, "events", "--help").stdout
    for flag in ("--since", "--follow", "--types", "--pretty", "--workspace", "--no-start"):
        assert flag in events
    assert "--json" in gridctl(ws, "status", "--help").stdout
    for action in ("start", "stop", "restart", "status"):
        assert action in gridctl(ws, "daemon", "--help").stdout
    version = gridctl(ws, "--version")
    assert version.returncode == 0
    assert version.stdout.startswith("gridctl ")


def test_gridctl_never_imports_the_daemon_side() -> None:
    code = (
        "import sys, gridd.cli.gridctl;"
        "bad = sorted(m for m in sys.modules"
        " if m.split('.')[:2] in (['gridd', 'daemon'], ['gridd', 'service'], ['gridd', 'api']));"
        "print(','.join(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == ""


# -- rendering, without a daemon ----------------------------------------------------------------


def _state_with_work() -> RepoState:
    now = datetime.now(UTC)
    return RepoState(
        session=SessionState(started=True, feature_branch="feat/login", max_agents=2),
        tasks=[Task(id="t1", title="login form", status=TaskStatus.WORKING)],
        agents=[
            Agent(
                id="a1",
                task_id="t1",
                profile="claude",
                worktree_path="/tmp/w",
                pid=4242,
                status=AgentStatus.RUNNING,
                started_at=now - timedelta(seconds=75),
                last_output="editing   [/bold] src/login.py\nnow",
            )
        ],
        pending_questions=[
            Question(
                id="q1", agent_id="a1", task_id="t1", question="Use OAuth?", options=["y", "n"]
            )
        ],
        stats=Stats(working=1),
        daemon=DaemonInfo(
            version="9.9.9",
            api_version=1,
            pid=77,
            uptime=3725.0,
            workspace="/tmp/ws",
            started_at=now,
            last_event_id=12,
            subscribers=0,
            warnings=["state database was unreadable"],
        ),
    )


def test_status_view_shows_session_agents_questions_and_warnings() -> None:
    console = Console(record=True, width=200, force_terminal=True)
    console.print(render_status.status_view(_state_with_work()))
    text = console.export_text()
    assert "gridd 9.9.9  pid 77  up 1h 2m 5s  last event #12" in text
    assert "feat/login" in text and "max 2 agents" in text
    assert "tasks (1)" in text
    assert "agents (1)" in text and "4242" in text and "1m 15s" in text
    assert "editing [/bold] src/login.py now" in text  # whitespace collapsed to one line
    assert re.search(r"Use OAuth\? +│ y / n +│ waiting \d+s", text)
    assert "warning: state database was unreadable" in text


def test_status_fits_80_columns_counting_only_the_statuses_tasks_are_in() -> None:
    console = Console(record=True, width=80, force_terminal=True)
    console.print(render_status.status_view(_state_with_work()))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    counts = text[text.index("tasks (1)") :].splitlines()
    assert counts[1].split() == ["working"] and counts[2].split() == ["1"]
    header = next(line for line in text.splitlines() if "agent" in line and "status" in line)
    for kept in ("agent", "task", "status", "last output"):
        assert kept in header, kept


def test_status_rejects_a_state_it_cannot_read() -> None:
    with pytest.raises(GriddError) as info:
        render.parse_state({"session": {}})
    assert info.value.code == "bad_response"


def test_event_lines_compact_json_and_pretty() -> None:
    event = SSEEvent(id=7, type="agent.output", data={"agentId": "a1", "chunk": "two words"})
    assert render_events.event_json(event) == (
        '{"id":7,"type":"agent.output","data":{"agentId":"a1","chunk":"two words"}}'
    )
    assert render_events.event_pretty(event) == '#7 agent.output agentId=a1 chunk="two words"'
    nested = SSEEvent(id=8, type="x", data={"files": ["a", "b"], "n": 1})
    assert render_events.event_pretty(nested) == '#8 x files=["a","b"] n=1'


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (59.9, "59s"), (60, "1m 0s"), (90061, "1d 1h 1m 1s")]
)
def test_duration_is_compact(seconds: float, text: str) -> None:
    assert render.duration(seconds) == text
