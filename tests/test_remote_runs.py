"""The remote run protocol: a run in a box of its own, mirrored into the local run
directory the pool watches. The box here is a directory with the real in-box shim
(``DirectoryBoxes``): nothing passes between daemon and box but the engine's create and
exec, so these are the protocol's guarantees whatever the engine."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from gridd.cli.render_agents import agents_table
from gridd.grid import Grid
from gridd.model import Agent, TaskStatus
from gridd.runs.boxes import DirectoryBoxes
from gridd.runs.mirror import RunMirror
from gridd.runs.remote import RemoteExecutor
from gridd.specs import PlanSpec, SessionStart, normalise_plan
from tests.support.boxes import remove_boxes
from tests.support.daemons import inprocess_daemon
from tests.support.git import git_show
from tests.support.processes import kill_workspace_agents
from tests.support.repos import agent_command
from tests.support.waits import until


async def first_line(grid: Grid, line: str, *, what: str) -> None:
    """Until an agent's last output line is ``line`` (its run mirrored this far)."""
    await until(lambda: any(a.last_output == line for a in grid.state.agents.values()), what=what)


def start_tasks(grid: Grid, *tasks: dict[str, str]) -> None:
    grid.commands.create_tasks(
        PlanSpec.model_validate(normalise_plan({"tasks": list(tasks)})).tasks
    )
    grid.commands.start_session(SessionStart.model_validate({"maxAgents": 2}))


@pytest.fixture
def boxes(tmp_path: Path) -> Iterator[DirectoryBoxes]:
    """The test's boxes; any left (boxes outlive a daemon, as containers do) go at the end."""
    engine = DirectoryBoxes(tmp_path / "boxes")
    yield engine
    remove_boxes(engine)


def config(**agents: list[str]) -> dict[str, object]:
    return {
        "scheduler": {"default_agent": next(iter(agents)), "tick_seconds": 0.25},
        "agents": {name: {"command": argv} for name, argv in agents.items()},
    }


async def test_a_boxed_run_takes_answers_through_its_inbox_and_its_branch_comes_back(
    repo: Path, tmp_path: Path, boxes: DirectoryBoxes
) -> None:
    executor = RemoteExecutor(boxes, workspace=repo)
    try:
        async with inprocess_daemon(
            repo, config(reader=agent_command("read_line.py")), executor=executor
        ) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "raw", "title": "read a line"})
            await first_line(
                grid, "ready for a line", what="the boxed agent's first line, mirrored"
            )
            [agent] = grid.state.agents.values()
            run_dir = Path(agent.run_dir)
            box = json.loads((run_dir / "remote.json").read_text())["box"]
            assert (tmp_path / "boxes" / box / "work").is_dir()  # it works in the box's clone
            grid.commands.respond(agent.id, "just some text")
            await until(lambda: grid.state.tasks["raw"].status == TaskStatus.REVIEW, what="review")
            assert git_show(repo, "grid/raw:answer.txt") == "just some text\n"
            assert (run_dir / "output.log").read_text() == "ready for a line\ngot a line\n"
            assert json.loads((run_dir / "exit.json").read_text())["exitCode"] == 0
            await until(lambda: not (tmp_path / "boxes" / box).exists(), what="the box removed")
    finally:
        kill_workspace_agents(repo)


async def test_a_restarted_daemon_reattaches_to_the_box_and_its_output_stays_contiguous(
    repo: Path, tmp_path: Path, boxes: DirectoryBoxes
) -> None:
    control = tmp_path / "control"
    control.mkdir()
    cfg = config(lines=agent_command("lines.py", str(control), "400"))
    try:
        async with inprocess_daemon(
            repo, cfg, executor=RemoteExecutor(boxes, workspace=repo)
        ) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "burst", "title": "many lines"})
            await until(
                lambda: any(a.last_output == "burst ready" for a in grid.state.agents.values()),
                what="the agent ready",
            )
            [agent] = grid.state.agents.values()
            # The daemon goes; the box and its agent do not. Everything below is written
            # while no daemon is there.
        (control / "go").touch()
        await until(lambda: (control / "burst.done").exists(), what="the burst written")
        (control / "end").touch()
        async with inprocess_daemon(
            repo, cfg, executor=RemoteExecutor(boxes, workspace=repo)
        ) as daemon:
            grid = daemon.grid
            await until(
                lambda: grid.state.tasks["burst"].status == TaskStatus.REVIEW, what="review"
            )
            [again] = grid.state.agents.values()
            assert again.id == agent.id  # the same run, reattached: no second one
        lines = (Path(agent.run_dir) / "output.log").read_text().splitlines()
        assert lines == ["burst ready"] + [f"burst line {n}" for n in range(1, 401)]
    finally:
        kill_workspace_agents(repo)


async def test_a_cancelled_boxed_run_is_stopped_in_its_box_and_the_box_goes(
    repo: Path, tmp_path: Path, boxes: DirectoryBoxes
) -> None:
    cfg = config(hang=agent_command("hang.py", str(tmp_path)))
    try:
        async with inprocess_daemon(
            repo, cfg, executor=RemoteExecutor(boxes, workspace=repo)
        ) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "stuck", "title": "never ends"})
            await until(lambda: (tmp_path / "stuck.pids").exists(), what="the hang agent")
            [agent] = grid.state.agents.values()
            await grid.commands.cancel_task("stuck")
            await until(lambda: not grid.state.live_agents(), what="the agent stopped")
            status = json.loads((Path(agent.run_dir) / "exit.json").read_text())
            assert status["exitCode"] != 0 or status["signal"] is not None
            await until(lambda: list(boxes.find({})) == [], what="the box removed")
    finally:
        kill_workspace_agents(repo)


class RecordingBoxes(DirectoryBoxes):
    """Boxes that note which thread each ``put`` came from."""

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.puts_on_loop: list[bool] = []

    def exec(self, name: str, args: list[str], *, stdin: bytes = b"") -> bytes:
        if args[0] == "put":
            self.puts_on_loop.append(threading.current_thread() is threading.main_thread())
        return super().exec(name, args, stdin=stdin)


async def test_an_answer_to_a_boxed_run_is_put_in_off_the_event_loop(
    repo: Path, tmp_path: Path
) -> None:
    engine = RecordingBoxes(tmp_path / "boxes")
    try:
        async with inprocess_daemon(
            repo,
            config(reader=agent_command("read_line.py")),
            executor=RemoteExecutor(engine, workspace=repo),
        ) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "raw", "title": "read a line"})
            await first_line(grid, "ready for a line", what="the boxed agent's first line")
            [agent] = grid.state.agents.values()
            grid.commands.respond(agent.id, "queued, then put")  # returns before any exec
            await until(lambda: grid.state.tasks["raw"].status == TaskStatus.REVIEW, what="review")
            assert git_show(repo, "grid/raw:answer.txt") == "queued, then put\n"
            assert engine.puts_on_loop == [False]  # by the mirror's thread, once
            assert not list((Path(agent.run_dir) / "outbox").iterdir())  # delivered, let go
    finally:
        kill_workspace_agents(repo)
        remove_boxes(engine)


ECHO = "import sys\nfor line in sys.stdin:\n    print('got', line.strip(), flush=True)\n"


async def test_a_restarted_daemons_answer_is_numbered_after_what_the_box_already_has(
    repo: Path, boxes: DirectoryBoxes
) -> None:
    base = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    bundle = subprocess.run(
        ["git", "-C", str(repo), "bundle", "create", "-q", "-", "main"], capture_output=True
    ).stdout
    spec = {"argv": [sys.executable, "-c", ECHO], "env": {}, "branch": "main", "base": base}
    boxes.create(
        "b", labels={}, files={"spec.json": json.dumps(spec).encode(), "base.bundle": bundle}
    )
    try:
        for seq, line in ((1, b"one\n"), (2, b"two\n")):  # put by an earlier daemon
            assert boxes.exec("b", ["put", str(seq), str(len(line)), "msg"], stdin=line) == b"new\n"
        run_dir = boxes.base / "local-run"
        run_dir.mkdir()
        # A new daemon's mirror knows nothing of them yet; its answer must come third.
        mirror = RunMirror(
            run_dir=run_dir, engine=boxes, box="b", worktree=repo, branch="main", base=base
        )
        mirror.queue(b"three\n", "msg")
        deadline = asyncio.get_running_loop().time() + 30
        while "got three" not in _text(run_dir / "output.log"):
            assert asyncio.get_running_loop().time() < deadline, _text(run_dir / "output.log")
            mirror.look()
            await asyncio.sleep(0.05)
        assert _text(run_dir / "output.log").splitlines() == ["got one", "got two", "got three"]
        assert mirror.highest_inbox == 3
    finally:
        boxes.remove("b")


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_the_in_box_inbox_keeps_each_numbered_message_once(boxes: DirectoryBoxes) -> None:
    boxes.base.mkdir()
    (boxes.base / "b").mkdir()
    shim = [str(Path(__import__("gridd").__file__).parent / "runs" / "boxshim.py")]
    root = str(boxes.base / "b")

    def put(seq: int, data: bytes) -> str:
        done = subprocess.run(
            ["python3", "-I", "-S", *shim, "put", root, str(seq), str(len(data)), "msg"],
            input=data,
            capture_output=True,
            check=True,
        )
        return done.stdout.decode().strip()

    assert put(1, b"first\n") == "new"
    assert put(1, b"first\n") == "dup"  # a retried put is not a second message
    assert put(2, b"second\n") == "new"
    inbox = boxes.base / "b" / "run" / "inbox"
    assert sorted(p.name for p in inbox.iterdir()) == ["00000001.msg", "00000002.msg"]


def test_gridctl_agents_shows_where_each_run_executes() -> None:
    boxed = Agent(
        id="reader-1",
        task_id="a",
        profile="reader",
        worktree_path="/w",
        executor={"kind": "podman", "box": "grid-1a2b3c4d-reader-1"},
    )
    here = Agent(id="reader-2", task_id="b", profile="reader", worktree_path="/w")
    console = Console(width=250, record=True, highlight=False)
    console.print(agents_table([boxed, here]))
    text = console.export_text()
    rows = {w: line for line in text.splitlines() for w in line.split() if w.startswith("reader-")}
    assert "podman grid-1a2b3c4d-reader-1" in rows["reader-1"]
    assert "local" in rows["reader-2"]


async def test_a_box_lost_mid_run_fails_the_run_honestly_and_the_task_is_retried(
    repo: Path, tmp_path: Path, boxes: DirectoryBoxes
) -> None:
    cfg = config(hang=agent_command("hang.py", str(tmp_path)))
    try:
        async with inprocess_daemon(
            repo, cfg, executor=RemoteExecutor(boxes, workspace=repo)
        ) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "stuck", "title": "loses its box"})
            await until(lambda: (tmp_path / "stuck.pids").exists(), what="the hang agent")
            [first] = grid.state.agents.values()
            box = json.loads((Path(first.run_dir) / "remote.json").read_text())["box"]
            (tmp_path / "stuck.pids").unlink()
            # The box's main process dies (an OOM, a lost node) and the agent with it.
            shim, _ = (tmp_path / "boxes" / box / "shim.pid").read_text().split()
            os.kill(int(shim), signal.SIGKILL)
            os.killpg(
                json.loads((tmp_path / "boxes" / box / "run" / "agent.json").read_text())["pid"],
                signal.SIGKILL,
            )
            await until(
                lambda: grid.state.agents[first.id].ended_at is not None, what="the run ended"
            )
            lost = grid.state.agents[first.id]
            assert lost.exit_code != 0 and lost.error and "supervisor" in lost.error
            assert not (Path(first.run_dir) / "exit.json").exists()  # nothing claims success
            # The usual rules retry it: a second run, in a box of its own.
            await until(lambda: (tmp_path / "stuck.pids").exists(), what="the retry running")
            assert len(grid.state.agents) == 2
            await until(lambda: not (tmp_path / "boxes" / box).exists(), what="the lost box gone")
    finally:
        kill_workspace_agents(repo)
