"""Start-up reconciliation: what an earlier daemon left behind, made consistent again.

Agents whose shim survived are reattached (``AgentPool.reattach``; runs that ended while we
were down then finish normally from their ``exit.json``). Worktrees and tasks are checked
against each other: a worktree no task owns is reported and kept (never deleted: it may
hold uncommitted work); a task whose worktree vanished is reported, and the worktree is
re-created from the task's branch when it next runs. A sandboxed run's own repository left
in a worktree no live run owns (a daemon died between making it and starting the run, or
while finishing it) is reclaimed: its commits onto the task's branch, the worktree a plain
one again (``git/private.py``). Nothing here deletes data.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from gridd.errors import GriddError
from gridd.events import EventBus
from gridd.git.private import PrivateRepos
from gridd.git.worktrees import Worktrees
from gridd.lifecycle import move_task
from gridd.model import TERMINAL_TASK_STATUSES, TaskStatus
from gridd.pool import AgentPool
from gridd.state import GridState

log = logging.getLogger(__name__)


async def recover(
    *,
    state: GridState,
    pool: AgentPool,
    worktrees: Worktrees,
    private: PrivateRepos,
    bus: EventBus,
) -> None:
    started = time.monotonic()
    live = state.live_agents()
    for agent in live:
        await pool.reattach(agent)
    # After the reattaches: a run fenced there (recorded, never started) is no longer live.
    busy = {a.worktree_path for a in state.live_agents()}
    await _reclaim_left(state=state, private=private, busy=busy)
    await _reconcile_worktrees(state=state, worktrees=worktrees, bus=bus)
    log.info("recovered %d agent(s) in %.3fs", len(live), time.monotonic() - started)


async def _reclaim_left(*, state: GridState, private: PrivateRepos, busy: set[str]) -> None:
    """Private repositories in the worktrees of tasks no live run works in (a live run's
    finish reclaims its own)."""
    for task in state.tasks.values():
        if task.worktree is None or task.worktree in busy:
            continue
        path = Path(task.worktree)
        try:
            if private.holds(path):
                log.info("reclaiming the run's repository left in %s", path)
                await private.reclaim(path)
        except (GriddError, OSError) as exc:
            log.error("the run's repository in %s could not be reclaimed: %s", path, exc)


async def _reconcile_worktrees(*, state: GridState, worktrees: Worktrees, bus: EventBus) -> None:
    on_disk = (
        sorted(p for p in worktrees.dir.iterdir() if p.is_dir()) if worktrees.dir.is_dir() else []
    )
    for path in on_disk:
        if path.name in state.tasks:
            continue
        dirty = await _dirty(worktrees, path)
        bus.publish(
            "worktree.orphaned",
            {
                "path": str(path),
                "dirty": dirty,
                "action": "kept",
                "hint": "no task owns this worktree; inspect it, then remove it with"
                " 'git worktree remove' (it is never deleted by gridd)",
            },
        )
    for task in state.tasks.values():
        if task.worktree is None or task.status in TERMINAL_TASK_STATUSES:
            continue
        if Path(task.worktree, ".git").exists():
            continue
        branch_ok = task.branch is not None and await worktrees.branch_exists(task.branch)
        bus.publish(
            "worktree.missing",
            {
                "taskId": task.id,
                "path": task.worktree,
                "branch": task.branch,
                "action": "re-created from its branch on the next run"
                if branch_ok
                else "started afresh on the next run (its branch is gone too)",
            },
        )
        if task.status == TaskStatus.REVIEW and not branch_ok:
            move_task(
                state,
                task.id,
                TaskStatus.BLOCKED,
                reason="worktree and branch missing",
                error="worktree and branch missing",
            )
    state.flush()


async def _dirty(worktrees: Worktrees, path: Path) -> bool | None:
    try:
        return await worktrees.is_dirty(path)
    except GriddError:  # not a worktree any more (half-removed): we cannot tell
        return None
