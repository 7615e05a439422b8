"""A stop, kill, cancel or session stop that races an agent's exit never throws a completed run away.

The agent does its work, waits for a go file, and exits 0 at once: the test creates the go
file and sends the request a few milliseconds apart, in both orders, so the request lands
before the exit, between the exit and the daemon noticing it, while the run's work is being
committed, or after the task reached ``review``. Whichever came first, a run that exited 0
has its result in ``review`` (a stop or kill) or on the branch its cancelled task names
(``keptBranch``); a run the request ended first is stopped. No illegal transition is ever
logged, and no finish fails."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gridd.client import GridClient
from tests.support.daemons import DaemonProc, core_daemon
from tests.support.git import git
from tests.support.repos import read_text_file, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for

#: Writes its work and a ready mark, waits for its go file, exits 0 (SIGTERM ends it early).
RACER = (
    "import os, pathlib, sys, time\n"
    "task = os.environ['GRID_TASK_ID']\n"
    "pathlib.Path('result.txt').write_text('result of ' + task + '\\n')\n"
    "marks = pathlib.Path(sys.argv[1])\n"
    "(marks / (task + '.ready')).write_text(str(os.getpid()))\n"
    "go = marks / (task + '.go')\n"
    "while not go.exists(): time.sleep(0.001)\n"
)

#: When the request is sent, relative to the go file (seconds; negative: the request first).
#: From just before the exit to well after it, in steps finer than a commit takes.
OFFSETS = [-0.004 + 0.005 * k for k in range(20)]

#: The request, sent raw: a 409 (the task already settled, the agent already exited) is one
#: of the orders being raced, not a failure.
Request = Callable[[httpx.Client, str, str], httpx.Response]
REQUESTS: dict[str, Request] = {
    "stop": lambda http, task, _agent: http.post(f"/tasks/{task}/stop"),
    "kill": lambda http, _task, agent: http.post(f"/agents/{agent}/kill"),
    "cancel": lambda http, task, _agent: http.delete(f"/tasks/{task}"),
    "session-stop": lambda http, _task, _agent: http.post("/session/stop"),
}
#: Where the request leaves a task whose run it ended first.
STOPPED_STATUS = {
    "stop": "ready",
    "kill": "blocked",
    "cancel": "cancelled",
    "session-stop": "ready",
}
REFUSED_CODES = {"task_not_working", "agent_exited", "task_finished"}


@pytest.fixture
def marks(repo: Path, tmp_path: Path) -> Path:
    """Where the racer agents mark themselves ready and find their go files; ``repo`` is
    configured with the ``racer`` profile."""
    path = tmp_path / "marks"
    path.mkdir()
    write_core_config(repo, agents={"racer": {"command": [sys.executable, "-c", RACER, str(path)]}})
    return path


def _started(c: GridClient, marks: Path, task_id: str) -> str:
    """Start ``task_id`` by hand (no session: a stopped task is not started again) and
    return its agent's id once the agent has done its work and waits for its go file."""
    c.post("/tasks", {"id": task_id, "title": f"race {task_id}", "agent": "racer"})
    c.post(f"/tasks/{task_id}/start")
    wait_for(lambda: read_text_file(marks / f"{task_id}.ready"), timeout=30)
    agent_id: str = wait_for(
        lambda: next((a["id"] for a in c.get("/agents") if a["taskId"] == task_id), None),
        timeout=30,
    )
    return agent_id


def _race(
    c: GridClient, marks: Path, kind: str, task_id: str, agent_id: str, offset: float
) -> httpx.Response:
    go = marks / f"{task_id}.go"
    send = REQUESTS[kind]
    if offset < 0:
        response = send(c._http, task_id, agent_id)
        time.sleep(-offset)
        go.write_text("")
    else:
        go.write_text("")
        time.sleep(offset)
        response = send(c._http, task_id, agent_id)
    if response.status_code != 200:
        assert response.status_code == 409, response.text
        assert response.json()["error"]["code"] in REFUSED_CODES, response.text
    return response


def _settled(c: GridClient, agent_id: str) -> dict[str, Any]:
    """The agent once its run is finished: settled and its task moved in one step."""
    agent: dict[str, Any] = wait_for(
        lambda: (a := c.get(f"/agents/{agent_id}"))["status"] == "exited" and a,
        timeout=30,
        message=f"agent {agent_id} to be finished",
    )
    return agent


def _check_kept(c: GridClient, repo: Path, kind: str, task_id: str, agent: dict[str, Any]) -> str:
    """What became of one raced run; asserts that a completed run kept its result."""
    task = c.get(f"/tasks/{task_id}")
    mine = [
        e.data
        for e in event_log(c, types={"agent.completed", "agent.stopped"})
        if e.data["agentId"] == agent["id"]
    ]
    if agent["exitCode"] != 0:  # the request ended the run first: it was stopped
        assert task["status"] == STOPPED_STATUS[kind], task
        assert [d.get("committedWork") for d in mine] == [True], mine
        return "stopped"
    # The run completed first: its result is kept, in review or on a branch the task names.
    assert len(mine) == 1 and "result" in mine[0], (task, mine)
    completed = mine[0]
    if kind == "cancel":
        assert task["status"] == "cancelled", task
        branch = task["keptBranch"] or task["branch"]
        # Cancelled before the result reached review: the task says where the work is.
        assert completed["keptBranch"] in (None, branch)
        assert task["keptBranch"] == completed["keptBranch"]
    else:
        assert task["status"] == "review", task
        assert task["changedFiles"] == ["result.txt"]
        branch = task["branch"]
    assert git(repo, "show", f"{branch}:result.txt") == f"result of {task_id}\n"
    return "completed"


def _no_illegal_transition(c: GridClient, daemon: DaemonProc) -> None:
    log = daemon.stderr_text()
    assert "illegal" not in log, [ln for ln in log.splitlines() if "illegal" in ln]
    bad = event_log(c, types={"lifecycle.illegal_transition", "agent.finish_failed"})
    assert bad == [], [(e.type, e.data) for e in bad]


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_a_request_racing_an_agents_exit_never_throws_its_completed_run_away(
    repo: Path, marks: Path, kind: str
) -> None:
    seen: dict[str, int] = {}
    with core_daemon(repo) as daemon:
        c = daemon.client()
        for i, offset in enumerate(OFFSETS):
            task_id = f"{kind}{i}"
            agent_id = _started(c, marks, task_id)
            _race(c, marks, kind, task_id, agent_id, offset)
            outcome = _check_kept(c, repo, kind, task_id, _settled(c, agent_id))
            seen[outcome] = seen.get(outcome, 0) + 1
        _no_illegal_transition(c, daemon)
    # The offsets reach past the exit: most runs complete before the request lands.
    assert seen.get("completed", 0) >= len(OFFSETS) // 2, seen


def _hold_index_lock(worktree: Path) -> Path:
    gitdir = Path(git(worktree, "rev-parse", "--absolute-git-dir").strip())
    lock = gitdir / "index.lock"
    lock.write_text("")
    return lock


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_a_request_while_a_completed_runs_work_is_committed_keeps_the_result(
    repo: Path, marks: Path, kind: str
) -> None:
    # The exact order of the 8 fuzzer failures: the agent has exited 0, its finish is
    # committing its work (held here by git's index lock, a transient error it retries),
    # and the request arrives before the commit is through.
    with core_daemon(repo) as daemon:
        c = daemon.client()
        agent_id = _started(c, marks, "late")
        worktree = Path(c.get(f"/agents/{agent_id}")["worktreePath"])
        lock = _hold_index_lock(worktree)
        (marks / "late.go").write_text("")
        wait_for(
            lambda: "index.lock" in daemon.stderr_text(),
            timeout=30,
            message="the commit after the agent's exit refused by the held lock",
        )
        assert c.get("/tasks/late")["status"] == "working"
        response = REQUESTS[kind](c._http, "late", agent_id)
        assert response.status_code == 200, response.text
        assert c.get("/tasks/late")["status"] == STOPPED_STATUS[kind]
        lock.unlink()
        agent = _settled(c, agent_id)
        assert agent["exitCode"] == 0
        assert _check_kept(c, repo, kind, "late", agent) == "completed"
        task = c.get("/tasks/late")
        if kind == "cancel":
            assert task["keptBranch"] == "grid/late"
        else:
            assert task["statusReason"].startswith("agent completed before the stop")
        _no_illegal_transition(c, daemon)


#: Like RACER, but a SIGTERM makes it exit 0 at once: a graceful stop, not a completion.
GRACEFUL = ("import signal, sys\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n") + RACER


def test_an_agent_that_exits_0_on_the_stops_sigterm_is_stopped_not_completed(
    repo: Path, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    write_core_config(
        repo, agents={"racer": {"command": [sys.executable, "-c", GRACEFUL, str(marks)]}}
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        agent_id = _started(c, marks, "graceful")
        assert c.post("/tasks/graceful/stop")["status"] == "ready"
        agent = _settled(c, agent_id)
        # It exited 0, but after the stop's signal, which it handles: the stop's doing.
        assert agent["exitCode"] == 0 and agent["signalledAt"] is not None
        task = c.get("/tasks/graceful")
        assert task["status"] == "ready" and task["keptBranch"] is None
        stopped = [e.data for e in event_log(c, types={"agent.stopped", "agent.completed"})]
        assert [(d["agentId"], d["committedWork"]) for d in stopped] == [(agent_id, True)]
        assert git(repo, "show", "grid/graceful:result.txt") == "result of graceful\n"
        _no_illegal_transition(c, daemon)
