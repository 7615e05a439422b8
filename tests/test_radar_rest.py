"""The conflict radar at rest: agents that only send heartbeats get no per-worktree git
(``_look`` re-reads a worktree for new output, a commit or a change of status, and now and
then, ever less often, for edits nobody announced). Driven sweep by sweep on a fake clock,
against real git worktrees, counting the git calls the radar makes."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gridd.background import Background
from gridd.events import EventBus
from gridd.git import radar as radar_module
from gridd.git.radar import IDLE_FACTOR, IDLE_MAX_FACTOR, Radar
from gridd.git.worktrees import GitResult
from gridd.lifecycle import move_agent
from gridd.model import Agent, AgentStatus, Task, TaskStatus, utcnow
from gridd.state import GridState
from gridd.store import Store

AGENTS = 6
PERIOD = 3.0


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@dataclass
class Rig:
    radar: Radar
    state: GridState
    calls: list[tuple[str, ...]]
    now: list[float]
    worktrees: dict[str, Path]

    def sweep(self, advance: float = PERIOD) -> int:
        """One sweep ``advance`` seconds after the last; the per-worktree git calls it made."""
        self.now[0] += advance
        before = len(self.calls)
        asyncio.run(self.radar.sweep())
        return sum(1 for c in self.calls[before:] if "for-each-ref" not in c)

    def heartbeat_all(self) -> None:
        for agent_id in list(self.state.live):
            self.state.update_agent(agent_id, last_heartbeat=utcnow(), activity="thinking")


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("a\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    _git(repo, "branch", "feature")
    store = Store.open(tmp_path / "grid.db")
    bus = EventBus(store, queue_size=64)
    state = GridState(store, bus)
    state.set_session(state.session.model_copy(update={"feature_branch": "feature"}))
    worktrees: dict[str, Path] = {}
    tasks = []
    for i in range(AGENTS):
        path = tmp_path / f"wt{i}"
        _git(repo, "worktree", "add", "-q", "-b", f"grid/t{i}", str(path), base)
        worktrees[f"t{i}"] = path
        tasks.append(
            Task(
                id=f"t{i}",
                title=f"t{i}",
                status=TaskStatus.WORKING,
                branch=f"grid/t{i}",
                worktree=str(path),
                base_commit=base,
            )
        )
    state.add_tasks(tasks)
    for i in range(AGENTS):
        state.put_agent(
            Agent(
                id=f"a{i}",
                task_id=f"t{i}",
                profile="p",
                worktree_path=str(worktrees[f"t{i}"]),
                status=AgentStatus.RUNNING,
            )
        )
    calls: list[tuple[str, ...]] = []
    real_git = radar_module.git

    async def counting_git(cwd: Path, *args: str, **kw: Any) -> GitResult:
        calls.append(args)
        return await real_git(cwd, *args, **kw)

    monkeypatch.setattr(radar_module, "git", counting_git)
    now = [1000.0]
    radar = Radar(
        state=state,
        bus=bus,
        root=repo,
        background=Background(),
        period=PERIOD,
        clock=lambda: now[0],
    )
    try:
        yield Rig(radar, state, calls, now, worktrees)
    finally:
        store.close()


def test_heartbeat_only_agents_get_no_worktree_rescans(rig: Rig) -> None:
    # The first look reads every worktree: git status each, and one git diff for what the
    # branches committed (all at the same commit yet: cached by base and head). One more
    # look once each is seen quiet (git status only: no branch has moved).
    assert rig.sweep() == AGENTS + 1
    rig.heartbeat_all()
    assert rig.sweep() == AGENTS
    # From then on heartbeats every period cost nothing but the one for-each-ref a sweep.
    for _ in range(IDLE_FACTOR - 1):
        rig.heartbeat_all()
        assert rig.sweep() == 0
    assert rig.radar.scans == 2 * AGENTS


def test_a_quiet_worktree_is_looked_at_ever_less_often(rig: Rig) -> None:
    rig.sweep()
    rig.sweep()  # the quiet look
    scans = rig.radar.scans
    looks_at: list[float] = []
    start = rig.now[0]
    for _ in range(600):  # half an hour of heartbeats, one sweep a period
        rig.heartbeat_all()
        if rig.sweep():
            looks_at.append(rig.now[0] - start)
    gaps = [b - a for a, b in zip([0.0, *looks_at], looks_at, strict=False)]
    assert gaps[:4] == [IDLE_FACTOR * PERIOD * 2**n for n in range(4)]
    assert max(gaps) == IDLE_MAX_FACTOR * PERIOD
    # 6 agents over 30 minutes: a handful of looks each, not 600.
    assert rig.radar.scans - scans == AGENTS * len(looks_at) <= AGENTS * 9


def test_output_a_commit_or_a_hand_edit_makes_the_radar_look_again(rig: Rig) -> None:
    rig.sweep()
    rig.sweep()
    assert rig.sweep() == 0
    # New output from one agent: that worktree only (git status; its branch did not move,
    # so what it committed is known already).
    rig.state.update_agent("a1", persist=False, output_seq=5)
    assert rig.sweep() == 1
    assert rig.sweep() == 1  # and once more as it goes quiet
    assert rig.sweep() == 0
    # A commit on another's branch.
    wt = rig.worktrees["t2"]
    (wt / "b.txt").write_text("b\n")
    _git(wt, "add", "b.txt")
    _git(wt, "commit", "-qm", "work")
    assert rig.sweep() == 2  # a moved branch: git diff of its commits, and git status
    assert rig.radar.seen["t2"].files == frozenset({"b.txt"})
    # An edit nobody announced is found by the idle look, which then comes sooner again.
    (rig.worktrees["t3"] / "hand.txt").write_text("by hand\n")
    looked = 0
    for _ in range(IDLE_FACTOR):
        rig.heartbeat_all()
        looked += rig.sweep()
    assert looked and "hand.txt" in rig.radar.seen["t3"].files
    assert rig.radar.seen["t3"].idle_gap == 0.0
    # An agent that exits (a change of status) gets its last look.
    move_agent(rig.state, "a4", AgentStatus.EXITED, reason="exited (0)")
    assert rig.sweep() == 1


def test_the_radar_reads_at_most_its_budget_of_worktrees_a_sweep_and_gets_to_them_all(
    rig: Rig,
) -> None:
    rig.radar.looks_per_second = 2 / PERIOD  # a budget of 2 worktrees a sweep
    reads: list[set[str]] = []
    for _ in range(6):
        for i in range(AGENTS):  # every agent prints all the time
            seq = rig.state.agents[f"a{i}"].output_seq + 1
            rig.state.update_agent(f"a{i}", persist=False, output_seq=seq)
        before = {t: s.scanned for t, s in rig.radar.seen.items()}
        rig.sweep()
        reads.append({t for t, s in rig.radar.seen.items() if s.scanned != before.get(t, 0.0)})
    assert all(len(r) == 2 for r in reads)
    # The longest unread go first: three sweeps cover all six, and again the next three.
    assert set().union(*reads[:3]) == set().union(*reads[3:]) == set(rig.worktrees)
    assert rig.radar.deferred == sum(AGENTS - 2 for _ in reads)
    # A branch that moved jumps the queue.
    wt = rig.worktrees["t5"]
    (wt / "c.txt").write_text("c\n")
    _git(wt, "add", "c.txt")
    _git(wt, "commit", "-qm", "work")
    before = rig.radar.seen["t5"].scanned
    rig.sweep()
    assert rig.radar.seen["t5"].scanned != before
    assert "c.txt" in rig.radar.seen["t5"].files
