"""A remote run's spawn: heard from the in-box shim's news, its inputs private to the box,
and a restart's reattach kept off the event loop. The box is a directory with the real
in-box shim (``DirectoryBoxes``), as in tests/test_remote_runs.py."""

from __future__ import annotations

import asyncio
import json
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.grid import Grid
from gridd.lifecycle import create_agent
from gridd.model import Agent, AgentStatus
from gridd.runs.boxes import BoxInfo, DirectoryBoxes
from gridd.runs.executor import AgentHandle, Launch
from gridd.runs.remote import RemoteExecutor, box_name
from gridd.specs import PlanSpec, normalise_plan
from tests.support.boxes import remove_boxes
from tests.support.daemons import inprocess_daemon
from tests.support.waits import until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class CountingBoxes(DirectoryBoxes):
    """Directory boxes that note each exec of the shim's commands."""

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.execs: list[str] = []

    def exec(self, name: str, args: list[str], *, stdin: bytes = b"") -> bytes:
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
    handle = await spawn_sleeper(executor, repo, tmp_path)
    assert handle.pid is not None and handle.exit_status() is None
    assert boxes.execs == []  # no look was needed to know it runs
    agent = json.loads((tmp_path / "runs" / "r1" / "agent.json").read_text())
    assert agent["pid"] == handle.pid
    # From then on the mirror's looks (execs) copy the run, as for any engine.
    await until(lambda: "poll" in boxes.execs, what="the mirror's first look")


async def test_the_spec_and_what_else_goes_into_a_box_are_readable_by_their_owner_only(
    repo: Path, tmp_path: Path, boxes: CountingBoxes, executor: RemoteExecutor
) -> None:
    handle = await spawn_sleeper(executor, repo, tmp_path)
    box = boxes.base / json.loads((handle.run_dir / "remote.json").read_text())["box"]
    assert "secret" in (box / "spec.json").read_text()  # the model's environment
    for name in ("spec.json", "base.bundle", "boxshim.py"):
        assert stat.S_IMODE((box / name).stat().st_mode) == 0o600, name


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
            grid.commands.create_tasks(
                PlanSpec.model_validate(
                    normalise_plan({"tasks": [{"id": "t1", "title": "t"}]})
                ).tasks
            )
            agent = create_agent(
                grid.state,
                Agent(
                    id="a1",
                    task_id="t1",
                    profile="default",
                    worktree_path=str(repo),
                    run_dir=str(run_dir),
                    executor={"kind": "directory", "box": remote["box"]},  # a box's, recorded
                ),
            )
            asyncio.get_running_loop().call_soon(engine.loop_ran.set)
            await grid.pool.reattach(agent)
            # The look (reattach) and the box's lookup (fence) each waited in a thread
            # while the loop ran on: neither timed out.
            assert engine.waited == [("poll", True), ("info", True)]
            assert grid.state.agents["a1"].status == AgentStatus.EXITED  # fenced: never ran
    finally:
        executor.close()
