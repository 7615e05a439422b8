"""Spawning is idempotent across restarts, and a spawn that fails fails only its attempt.

A daemon killed (SIGKILL, at the ``spawn.recorded`` and ``spawn.started`` crash points)
while a spawn is in flight never runs the task twice at once in its worktree after a
restart: the agent recorded before the spawn is reattached if it runs, or its run is
fenced and the task started afresh. Process lifetimes come from the shim's own records
(``agent.json``'s ``startedAt``, ``exit.json``'s ``endedAt``), not from events.
The fence itself is shown on a real shim: a run fenced first is never started by a late
shim, and a run its shim claimed first is not fenced. A spawn the daemon gives up on (its
shim server stopped) is fenced the same way: the task runs again, once, and the late shim
starts nothing.

An ``OSError`` from the executor (here: the runs directory replaced by a file, so no run
directory can be made) settles the agent as exited, fails the attempt with its reason and
counts it toward ``maxAttempts``; the session goes on with the next task.
"""

from __future__ import annotations

import contextlib
import itertools
import marshal
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from gridd.errors import DaemonUnreachable
from gridd.pool.rundirs import new_run
from gridd.runs.executor import Launch
from gridd.runs.local import LocalExecutor
from gridd.runs.starter import SHIM_PATH
from tests.support.api import socket_answers, wait_task_status
from tests.support.daemons import Restartable, restartable_daemon, running_daemon, start_daemon
from tests.support.repos import agent_command, read_json_file, write_core_config
from tests.support.sse import event_log, wait_for_events
from tests.support.waits import wait_for


def _config(repo: Path, *, crash: str | None, stop_when_idle: bool = True) -> None:
    write_core_config(
        repo,
        agents={"work": {"command": agent_command("trivial.py", "2.0")}},
        scheduler={"default_agent": "work", "stop_when_idle": stop_when_idle},
    )
    if crash is not None:
        with (repo / ".grid" / "config.toml").open("a") as fh:
            fh.write(f'\n[daemon]\ncrash_points = ["{crash}"]\n')


def _die_mid_spawn(grid: Restartable, task: dict[str, object]) -> None:
    """Create ``task`` and start a session: the daemon, configured with a crash point,
    dies (SIGKILL) on the way to starting its agent."""
    c = grid.client()
    c.post("/tasks", task)
    with contextlib.suppress(DaemonUnreachable, httpx.TransportError):
        c.post("/session/start", {"maxAgents": 1})
    assert grid.daemon is not None
    assert grid.daemon.proc.wait(30) is not None, "the daemon did not die at its crash point"


def _lifetimes(agents: list[dict[str, object]]) -> list[tuple[float, float]]:
    """(started, ended) of every agent process that ran, from its shim's records."""
    spans = []
    for agent in agents:
        run_dir = Path(str(agent["runDir"]))
        started = read_json_file(run_dir / "agent.json")
        if started is None:
            continue  # this run never started a process
        ended = wait_for(lambda d=run_dir: read_json_file(d / "exit.json"), timeout=30)
        spans.append((float(started["startedAt"]), float(ended["endedAt"])))
    return sorted(spans)


@pytest.mark.parametrize("point", ["spawn.recorded", "spawn.started"])
def test_a_daemon_killed_mid_spawn_runs_the_task_once_at_a_time_after_restart(
    repo: Path, point: str
) -> None:
    _config(repo, crash=point)
    with restartable_daemon(repo) as grid:
        c = grid.client()
        _die_mid_spawn(grid, {"id": "once", "title": "runs once at a time", "maxAttempts": 1})
        _config(repo, crash=None)
        grid.start()
        task = wait_task_status(c, "once", "review", timeout=60)
        agents = [a for a in c.get("/agents", params={"all": "1"}) if a["taskId"] == "once"]
        spans = _lifetimes(agents)
        assert len(spans) == 1, f"the task's agent ran {len(spans)} times: {spans}"
        # One attempt in all: an interrupted spawn that never ran is not counted (with
        # maxAttempts 1, counting it would have failed the task).
        assert task["attempts"] == 1
        assert not [e for e in event_log(c) if e.type == "agent.failed"]
        interrupted = [e.data for e in event_log(c, types={"agent.spawn_interrupted"})]
        if point == "spawn.recorded":
            assert [(e["taskId"], e["action"]) for e in interrupted] == [("once", "respawn")]
            assert len(agents) == 2  # the fenced one (exited, never ran) and the new one
        else:
            assert interrupted == []
            assert len(agents) == 1
            adopted = [e.data for e in event_log(c, types={"agent.reattached"})]
            assert [e["agentId"] for e in adopted] == [agents[0]["id"]]


def test_runs_never_overlap_in_a_worktree_across_repeated_mid_spawn_kills(repo: Path) -> None:
    """Killed before one spawn, restarted, killed right after the next: every process's
    lifetime ends before the next one's starts, and the task still finishes."""
    _config(repo, crash="spawn.recorded")
    with restartable_daemon(repo) as grid:
        c = grid.client()
        _die_mid_spawn(grid, {"id": "twice", "title": "killed twice", "maxAttempts": 1})
        _config(repo, crash="spawn.started")
        # fences the first run, spawns again, dies right after: maybe before /health was
        # ever seen to answer, so the start does not wait for it
        grid.daemon = start_daemon(repo, wait=False)
        assert grid.daemon.proc.wait(30) is not None
        _config(repo, crash=None)
        grid.start()
        wait_task_status(c, "twice", "review", timeout=60)
        agents = [a for a in c.get("/agents", params={"all": "1"}) if a["taskId"] == "twice"]
        spans = _lifetimes(agents)
        assert len(spans) == 1, f"the task's agent ran {len(spans)} times: {spans}"
        for (_, ended), (started, _) in itertools.pairwise(spans):
            assert ended <= started, f"two agents ran at once in one worktree: {spans}"


def test_an_oserror_while_spawning_fails_the_attempt_cleanly_and_the_session_goes_on(
    repo: Path,
) -> None:
    _config(repo, crash=None, stop_when_idle=False)  # the session outlives the failed task
    runs = repo / ".grid" / "runs"
    with running_daemon(repo) as daemon:
        c = daemon.client()
        shutil.rmtree(runs)
        runs.write_text("not a directory\n")  # no run directory can be made under it
        c.post("/tasks", {"id": "doomed", "title": "cannot start", "maxAttempts": 2})
        c.post("/session/start", {"maxAgents": 1})
        task = wait_task_status(c, "doomed", "failed", timeout=60)
        agents = c.get("/agents", params={"all": "1"})
        for agent in agents:  # settled, with the reason: never left starting or stopping
            assert agent["status"] == "exited"
            assert "NotADirectoryError" in str(agent["error"])
        assert c.get("/agents") == []
        assert task["attempts"] == 2
        assert "NotADirectoryError" in str(task["error"]) and str(runs) in str(task["error"])
        failures = [e.data for e in event_log(c, types={"task.start_failed"})]
        assert [f["attempt"] for f in failures] == [1, 2]
        assert {f["agentId"] for f in failures} == {a["id"] for a in agents}
        # The session did not stall: with the directory back, the next task runs.
        runs.unlink()
        runs.mkdir(mode=0o700)
        c.post("/tasks", {"id": "fine", "title": "starts normally"})
        wait_task_status(c, "fine", "review", timeout=60)
        assert c.get("/tasks/doomed")["status"] == "failed"


def _run_dir_for(tmp_path: Path, name: str) -> Path:
    """A run directory with a spec whose agent leaves ``ran`` in the work directory."""
    run_dir, work = tmp_path / name, tmp_path / f"{name}-work"
    run_dir.mkdir()
    work.mkdir()
    spec = {
        "argv": [sys.executable, "-c", "open('ran', 'w').write('x')"],
        "cwd": str(work),
        "env": {"PATH": os.environ.get("PATH", "")},
        "stdin": "null",
    }
    (run_dir / "spec.marshal").write_bytes(marshal.dumps(spec))
    return run_dir


def _shim(run_dir: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-I", "-S", str(SHIM_PATH), str(run_dir)], timeout=30, check=False
    )


def test_a_fenced_run_is_never_started_by_a_late_shim(tmp_path: Path) -> None:
    run_dir = _run_dir_for(tmp_path, "late")
    assert LocalExecutor(tmp_path).fence(run_dir) is True
    assert _shim(run_dir).returncode == 0
    assert not (tmp_path / "late-work" / "ran").exists()
    assert not (run_dir / "agent.json").exists() and not (run_dir / "exit.json").exists()
    assert LocalExecutor(tmp_path).fence(run_dir) is True  # a second restart: still fenced


def test_a_run_its_shim_claimed_first_is_not_fenced(tmp_path: Path) -> None:
    run_dir = _run_dir_for(tmp_path, "early")
    assert _shim(run_dir).returncode == 0
    assert (tmp_path / "early-work" / "ran").exists()
    assert LocalExecutor(tmp_path).fence(run_dir) is False  # reattach it instead


async def test_the_executor_never_starts_a_run_over_an_existing_runs_spec(tmp_path: Path) -> None:
    run_dir = _run_dir_for(tmp_path, "used")
    before = (run_dir / "spec.marshal").read_bytes()
    with pytest.raises(FileExistsError):
        await LocalExecutor(tmp_path).spawn(
            Launch(run_dir=run_dir, argv=["true"], cwd=tmp_path, env={}, stdin="null")
        )
    assert (run_dir / "spec.marshal").read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir()) == ["spec.marshal"]


def test_a_new_run_skips_every_run_directory_on_disk(tmp_path: Path) -> None:
    class FreshCounter:  # a new database: numbering starts again at 1
        value = 0

        def next_counter(self, name: str, *, past: int = 0) -> int:
            self.value = max(self.value, past) + 1
            return self.value

    for name in ("work-1", "review-2-7", "spare-shim.log"):
        (tmp_path / name).mkdir()
    counter = FreshCounter()
    assert new_run(counter, tmp_path, "work") == ("work-8", tmp_path / "work-8")
    assert new_run(counter, tmp_path, "work") == ("work-9", tmp_path / "work-9")
    assert (tmp_path / "work-9").is_dir() and not any((tmp_path / "work-9").iterdir())


def _shim_server(marker: str) -> psutil.Process | None:
    """The shim server of the daemon started with ``GRID_TEST_DAEMON=marker``."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if str(SHIM_PATH) not in cmdline or not any(a.startswith("--control-fd=") for a in cmdline):
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("GRID_TEST_DAEMON") == marker:
                return proc
    return None


def test_a_spawn_given_up_on_is_fenced_and_its_late_shim_never_runs_the_task_twice(
    repo: Path,
) -> None:
    """The shim server is stopped (SIGSTOP) while a spawn waits for it: the daemon gives the
    spawn up and starts the task again in a new run. When the server resumes, the run it
    was handed exits fenced: one run of the task, never two at once in its worktree."""
    write_core_config(
        repo,
        agents={"work": {"command": agent_command("trivial.py", "2.0")}},
        scheduler={"default_agent": "work", "spawn_timeout_seconds": 3.0},
    )
    marker = f"spawn-fence-{os.getpid()}-{repo.name}"
    with running_daemon(repo, env={"GRID_TEST_DAEMON": marker}) as daemon:
        c = daemon.client()
        server = wait_for(lambda: _shim_server(marker), timeout=15, message="the shim server")
        server.suspend()
        try:
            c.post("/tasks", {"id": "x", "title": "runs once", "maxAttempts": 3})
            c.post("/session/start", {"maxAgents": 1})
            (failed, *_) = wait_for_events(c, {"task.start_failed"}, 1, timeout=60)
        finally:
            server.resume()
        wait_task_status(c, "x", "review", timeout=60)
        agents = [a for a in c.get("/agents", params={"all": "1"}) if a["taskId"] == "x"]
        late = Path(next(str(a["runDir"]) for a in agents if a["id"] == failed.data["agentId"]))
        # The server, resumed, forks the shim it was asked for: it finds the run fenced.
        shim_log = wait_for(
            lambda: (
                (late / "agent.json").exists()
                or ((late / "shim.log").exists() and (late / "shim.log").read_text())
            ),
            timeout=30,
            message="the late shim to act",
        )
        assert not (late / "agent.json").exists(), "the abandoned run started after all"
        assert "not starting the agent" in str(shim_log)
        assert (late / "claim").read_text().startswith("fenced: abandoned")
        spans = _lifetimes(agents)
        assert len(spans) == 1, f"the task's agent ran {len(spans)} times: {spans}"
        assert "fenced" in str(failed.data["error"])


def test_a_run_its_shim_claimed_but_has_not_started_gets_no_second_run_after_a_restart(
    repo: Path,
) -> None:
    """A daemon died mid-spawn; the run's shim claimed it and is stopped (a stand-in
    process holds the claim, as a SIGSTOPped shim would). The restarted daemon cannot fence
    the run: it watches it through that shim, and the task gets a second run only once that
    shim is gone (it can then start nothing any more)."""
    _config(repo, crash="spawn.recorded")
    stand_in = subprocess.Popen(["sleep", "600"])
    try:
        with restartable_daemon(repo) as grid:
            c = grid.client()
            _die_mid_spawn(grid, {"id": "held", "title": "claimed, not started", "maxAttempts": 3})
            (run_dir,) = (repo / ".grid" / "runs").glob("work-*")
            (run_dir / "claim").write_text(f"shim {stand_in.pid}\n")
            _config(repo, crash=None)
            # Recovery waits SETTLE_SECONDS for the shim to speak before the daemon serves.
            grid.daemon = start_daemon(repo, wait=False)
            wait_for(lambda: socket_answers(grid.sock), timeout=60, message="the restart")
            wait_for_events(c, {"agent.reattached"}, 1)
            held = c.get("/agents", params={"all": "1"})
            assert [(a["taskId"], a["status"]) for a in held] == [("held", "starting")]
            mark = int(c.get("/state")["daemon"]["lastEventId"])
            stand_in.kill()  # the shim dies without a word: its run can never start now
            stand_in.wait()
            wait_task_status(c, "held", "review", timeout=60)
            failed = event_log(c, types={"agent.failed", "agent.spawned"})
            first = [e for e in failed if e.data["agentId"] == held[0]["id"]]
            assert first and all(e.id is not None and e.id > mark for e in first), [
                (e.id, e.type) for e in failed
            ]
            spawned = [e for e in failed if e.type == "agent.spawned"]
            assert spawned and all(e.id is not None and e.id > mark for e in spawned)
    finally:
        stand_in.kill()
        stand_in.wait()
