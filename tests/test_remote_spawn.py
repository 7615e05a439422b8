"""A remote run's spawn: heard from the in-box shim's news, its inputs private to the box,
and a restart's reattach kept off the event loop (a claim's recheck waiting for it). The box
is a directory with the real in-box shim (``DirectoryBoxes``), as in tests/test_remote_runs.py."""

from __future__ import annotations

import asyncio
import json
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gridd.git.prepared import owned
from gridd.grid import Grid
from gridd.lifecycle import create_agent, move_agent, move_task
from gridd.model import Agent, AgentStatus, TaskStatus
from gridd.runs.boxes import BoxInfo, DirectoryBoxes
from gridd.runs.executor import AgentHandle, Launch, running_fields
from gridd.runs.remote import RemoteExecutor, box_name
from gridd.specs import PlanSpec, normalise_plan
from tests.support.boxes import remove_boxes
from tests.support.daemons import inprocess_daemon
from tests.support.processes import kill_workspace_agents
from tests.support.waits import until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class CountingBoxes(DirectoryBoxes):
    """Directory boxes that note each exec of the shim's commands. While ``looks`` is
    clear, a look (``poll``, the mirror's, from its own thread) waits for it, at most 10 s,
    before it is noted: a test can then tell the spawn's execs from the mirror's."""

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.execs: list[str] = []
        self.looks = threading.Event()
        self.looks.set()

    def exec(self, name: str, args: list[str], *, stdin: bytes = b"") -> bytes:
        if args[0] == "poll":
            self.looks.wait(10)
        self.execs.append(args[0])
        return super().exec(name, args, stdin=stdin)


@pytest.fixture
def boxes(tmp_path: Path) -> Iterator[CountingBoxes]:
    engine = CountingBoxes(tmp_path / "boxes")
    yield engine
    remove_boxes(engine)


@pytest.fixture
def executor(repo: Path, boxes: CountingBoxes) -> Iterator[RemoteExecutor]:
    made = RemoteExecutor(boxes, workspace=repo)
    yield made
    made.close()


async def spawn_sleeper(executor: RemoteExecutor, repo: Path, tmp_path: Path) -> AgentHandle:
    """A run (``runs/r1``) of an agent that sleeps, with a model's key in its environment."""
    return await executor.spawn(
        Launch(
            run_dir=tmp_path / "runs" / "r1",
            argv=SLEEPER,
            cwd=repo,
            env={"GRID_TASK_ID": "t1", "ANTHROPIC_API_KEY": "secret"},
            stdin="null",
            executor="directory",
        )
    )


async def test_a_spawn_hears_the_agent_start_from_the_shims_news_without_an_exec(
    repo: Path, tmp_path: Path, boxes: CountingBoxes, executor: RemoteExecutor
) -> None:
    boxes.looks.clear()  # the mirror's first look, once the spawn returned, waits
    handle = await spawn_sleeper(executor, repo, tmp_path)
    assert handle.pid is not None and handle.exit_status() is None
    assert boxes.execs == []  # no look was needed to know it runs
    agent = json.loads((tmp_path / "runs" / "r1" / "agent.json").read_text())
    assert agent["pid"] == handle.pid
    # From then on the mirror's looks (execs) copy the run, as for any engine.
    boxes.looks.set()
    await until(lambda: "poll" in boxes.execs, what="the mirror's first look")


async def test_the_spec_and_what_else_goes_into_a_box_are_readable_by_their_owner_only(
    repo: Path, tmp_path: Path, boxes: CountingBoxes, executor: RemoteExecutor
) -> None:
    handle = await spawn_sleeper(executor, repo, tmp_path)
    box = boxes.base / json.loads((handle.run_dir / "remote.json").read_text())["box"]
    assert "secret" in (box / "spec.json").read_text()  # the model's environment
    for name in ("spec.json", "base.bundle", "boxshim.py"):
        assert stat.S_IMODE((box / name).stat().st_mode) == 0o600, name


def create_t1(grid: Grid) -> None:
    grid.commands.create_tasks(
        PlanSpec.model_validate(normalise_plan({"tasks": [{"id": "t1", "title": "t"}]})).tasks
    )


def recorded_run(
    grid: Grid, repo: Path, run_dir: Path, *, worktree: Path, claim_pending: bool = False
) -> Agent:
    """Agent ``a1`` of task ``t1`` as an earlier daemon recorded it (``starting``), with the
    executor record a box's run always has: its run in the box named after ``run_dir``."""
    return create_agent(
        grid.state,
        Agent(
            id="a1",
            task_id="t1",
            profile="default",
            worktree_path=str(worktree),
            run_dir=str(run_dir),
            executor={"kind": "directory", "box": box_name(repo, run_dir)},
            claim_pending=claim_pending,
        ),
    )


class SlowBoxes(DirectoryBoxes):
    """An engine whose answers wait until the event loop has run a callback scheduled just
    before (``loop_ran``), or 5 s: an engine call made on the loop blocks it, and then the
    loop cannot run that callback."""

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.loop_ran = threading.Event()
        self.waited: list[tuple[str, bool]] = []

    def exec(self, name: str, args: list[str], *, stdin: bytes = b"") -> bytes:
        self.waited.append((args[0], self.loop_ran.wait(5)))
        return super().exec(name, args, stdin=stdin)

    def info(self, name: str) -> BoxInfo | None:
        self.waited.append(("info", self.loop_ran.wait(5)))
        return super().info(name)


async def test_a_restarted_daemon_reattaches_and_fences_a_boxed_run_off_the_event_loop(
    repo: Path, tmp_path: Path
) -> None:
    engine = SlowBoxes(tmp_path / "boxes")
    executor = RemoteExecutor(engine, workspace=repo)
    # A run an earlier daemon recorded without a pid, its box never made (or gone).
    run_dir = tmp_path / "runs" / "a1"
    run_dir.mkdir(parents=True)
    remote = {"engine": "directory", "box": box_name(repo, run_dir), "worktree": str(repo)}
    (run_dir / "remote.json").write_text(json.dumps({**remote, "branch": "main", "base": ""}))
    try:
        async with inprocess_daemon(repo, executor=executor) as daemon:
            grid: Grid = daemon.grid
            create_t1(grid)
            agent = recorded_run(grid, repo, run_dir, worktree=repo)
            asyncio.get_running_loop().call_soon(engine.loop_ran.set)
            await grid.pool.reattach(agent)
            # The look (reattach) and the box's lookup (fence) each waited in a thread
            # while the loop ran on: neither timed out.
            assert engine.waited == [("poll", True), ("info", True)]
            assert grid.state.agents["a1"].status == AgentStatus.EXITED  # fenced: never ran
    finally:
        executor.close()


#: The longest a held exec waits for what it waits for: a bound, never reached when the bug
#: is there (what it waits for then comes at once), reached when it is fixed.
HOLD_SECONDS = 3.0


class HeldBoxes(DirectoryBoxes):
    """Directory boxes whose next exec of a command (``hold``) waits in its thread until
    ``until()`` holds, or ``HOLD_SECONDS``: e.g. a restart's reattach of a box's run (its
    first ``poll``), held. ``held`` names the commands held so far."""

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.holds: dict[str, Callable[[], bool]] = {}
        self.held: set[str] = set()

    def hold(self, command: str, *, until: Callable[[], bool]) -> None:
        self.holds[command] = until

    def exec(self, name: str, args: list[str], *, stdin: bytes = b"") -> bytes:
        until = self.holds.pop(args[0], None)
        if until is not None:
            self.held.add(args[0])
            deadline = time.monotonic() + HOLD_SECONDS
            while not until() and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().exec(name, args, stdin=stdin)


async def restarted_box_run(grid: Grid, repo: Path, boxes: Path, run_dir: Path) -> Agent:
    """Task ``t1``, working, and its agent ``a1`` as an earlier daemon left them: its run in
    a box (of ``boxes``) that outlived that daemon, its claim still pending (with no source
    configured to ask: it cannot be answered)."""
    create_t1(grid)
    worktree = await grid.worktrees.create("t1", None)
    earlier = RemoteExecutor(DirectoryBoxes(boxes), workspace=repo)
    env = {"GRID_TASK_ID": "t1", "GRID_WORKSPACE": str(repo.resolve())}
    handle = await earlier.spawn(
        Launch(run_dir, SLEEPER, worktree.path, env, stdin="null", executor="directory")
    )
    earlier.close()
    move_task(grid.state, "t1", TaskStatus.WORKING, reason="started")
    agent = recorded_run(grid, repo, run_dir, worktree=worktree.path, claim_pending=True)
    fields = running_fields(agent, handle)
    return move_agent(grid.state, "a1", AgentStatus.RUNNING, reason="spawned", **fields)


async def set_aside(grid: Grid) -> dict[str, Any]:
    """The one ``agent.stopped`` of the run, once its work is set aside."""
    stopped = await until(
        lambda: grid.state.store.events_after(0, types=["agent.stopped"]),
        timeout=30,
        what="the run stopped",
    )
    assert len(stopped) == 1
    assert grid.state.agents["a1"].claim_pending is False
    return stopped[0].data


async def test_a_claim_recheck_acts_on_a_boxed_run_only_once_its_reattach_registered_it(
    repo: Path, tmp_path: Path
) -> None:
    """A restarted daemon rechecks the claim an earlier daemon left pending for a run in a
    box (here it cannot be asked: no source is configured for it), while the run's reattach
    waits for the box's engine in a thread. Its answer (stop the run, set its work aside)
    is acted on once the run is registered: before, the stop found no run and was lost, and
    the scheduler stopped the run later as "task no longer working". The reattach's thread
    is held until the recheck has given the task up, so that it acts in that window if it
    can."""
    engine = HeldBoxes(tmp_path / "boxes")
    executor = RemoteExecutor(engine, workspace=repo)
    try:
        async with inprocess_daemon(repo, executor=executor) as daemon:
            grid: Grid = daemon.grid
            agent = await restarted_box_run(grid, repo, engine.base, tmp_path / "runs" / "a1")
            engine.hold("poll", until=lambda: grid.state.tasks["t1"].status != TaskStatus.WORKING)
            await grid.pool.reattach(agent)
            assert engine.held == {"poll"}  # the reattach's look was the held one
            stopped = await set_aside(grid)
            assert stopped["reason"] == "claim unanswered"
            assert stopped["committedWork"] is False
    finally:
        executor.close()
        kill_workspace_agents(repo)
        remove_boxes(engine)


async def test_a_run_being_set_aside_keeps_its_worktree_from_the_preparer(
    repo: Path, tmp_path: Path
) -> None:
    """A run whose claim went unanswered is stopped and its work set aside; meanwhile its
    task is ready again, as a first attempt (no branch). Until the run is finished its
    worktree is its own: the worktree preparer (which takes on a ready task's pristine
    worktree after a restart, reading it with ``git status``) leaves it alone, or its git
    and the set-aside's commit collide on the worktree's ``index.lock``. The stop's signal
    is held until that is checked."""
    engine = HeldBoxes(tmp_path / "boxes")
    executor = RemoteExecutor(engine, workspace=repo)
    checked = threading.Event()
    try:
        async with inprocess_daemon(repo, executor=executor) as daemon:
            grid: Grid = daemon.grid
            agent = await restarted_box_run(grid, repo, engine.base, tmp_path / "runs" / "a1")
            engine.hold("signal", until=checked.is_set)
            await grid.pool.reattach(agent)
            await until(lambda: "signal" in engine.held, what="the stop's signal, held")
            task = grid.state.tasks["t1"]
            assert (task.status, task.branch) == (TaskStatus.READY, None)
            assert owned(task, busy=grid.prepared.busy())
            checked.set()
            stopped = await set_aside(grid)
            assert stopped["reason"] == "claim unanswered"
            assert stopped["keptBranch"] == "grid-kept/t1-a1"
    finally:
        executor.close()
        kill_workspace_agents(repo)
        remove_boxes(engine)
