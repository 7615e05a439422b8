"""Prepared worktrees: the next tasks' worktrees made while the slots are busy.

``git worktree add`` checks out a whole tree (64-246 ms per task on a small repository, more
on a large one); made when a slot frees, it sits between one agent's exit and the next
agent's start. So while agents run, the worktrees of the tasks that will start next (ready
tasks in start order, then pending tasks whose dependencies are all under way: the next
wave) are made ahead, as spare shims are started ahead (``runs/starter.py``). Nothing about
a prepared worktree is in the task's record: it is the task's ordinary worktree (the same
path and ``grid/<id>`` branch), made early.

The rules:

- **Never a stale base.** A prepared worktree is used only after the feature branch's tip is
  read again when its task starts. If a merge moved the tip since, the worktree is moved to
  it in place (``git reset --hard``: it holds nothing of its own, so only the files the
  merge changed are rewritten), else it is made afresh.
- **Nothing lost, nothing started twice.** A task cancelled, deleted, blocked or re-planned
  away loses its prepared worktree (``Worktrees.discard``, which refuses a worktree holding
  any work); the start of a task waits for its worktree's preparation or removal in flight,
  so the two never race. Preparing changes no task, and a daemon killed while worktrees are
  prepared leaves only pristine ones: the next daemon adopts those (or the start path moves
  them to the tip, see ``Worktrees.create``). A worktree whose task has taken it over
  (``owned``: starting, working, or a branch in its record) is only ever forgotten here,
  never removed: the task's record, and perhaps its running agent, point at it.

The decision (``worth_preparing``) is a pure function; this module does the git work, one
worktree at a time, off the critical path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from gridd.background import Background
from gridd.git.worktrees import GitError, Worktree, Worktrees, git
from gridd.model import Task, TaskStatus
from gridd.plan import start_order
from gridd.state import GridState

log = logging.getLogger(__name__)

#: A dependency in one of these will be done soon: its dependents are the next wave.
UNDER_WAY = frozenset({TaskStatus.DONE, TaskStatus.WORKING, TaskStatus.REVIEW, TaskStatus.MERGING})
#: Look again at least this often (the state's changes wake it sooner).
TICK_SECONDS = 5.0


# -- the decision (PURE) --------------------------------------------------------------------


def worth_preparing(tasks: Sequence[Task], *, busy: AbstractSet[str], limit: int) -> list[str]:
    """The ids of the tasks whose worktree is worth making now, at most ``limit``: ready
    tasks in start order, then pending ones whose dependencies are all under way. Only a
    first run (a task with no branch yet): a retry reuses its own worktree."""
    if limit <= 0:
        return []
    statuses = {t.id: t.status for t in tasks}
    fresh = [t for t in sorted(tasks, key=start_order) if t.branch is None and t.id not in busy]
    ready = [t.id for t in fresh if t.status == TaskStatus.READY]
    soon = [
        t.id
        for t in fresh
        if t.status == TaskStatus.PENDING
        and all(statuses.get(d) in UNDER_WAY for d in t.depends_on)
    ]
    return (ready + soon)[:limit]


def keeps(
    task: Task | None, *, wanted: AbstractSet[str], busy: AbstractSet[str], session: bool
) -> bool:
    """Whether a prepared worktree stays: its task is being started (the start takes it),
    or, while the session runs, wanted or still ready (it starts in its turn). Anything
    else (cancelled, deleted, blocked, re-planned behind new dependencies, given a branch
    meanwhile, or the session stopped) loses it."""
    if task is None or task.branch is not None:
        return False
    if task.id in busy or task.status == TaskStatus.WORKING:
        return True
    return session and (task.id in wanted or task.status == TaskStatus.READY)


def owned(task: Task | None, *, busy: AbstractSet[str]) -> bool:
    """Whether a task has taken its worktree over: it is starting or working, or its record
    names a branch (a run started there). The preparer then only forgets the worktree: it
    is the task's own, and removing it would leave the record (and perhaps a running agent)
    pointing at nothing."""
    if task is None:
        return False
    return task.branch is not None or task.id in busy or task.status == TaskStatus.WORKING


# -- the git work ---------------------------------------------------------------------------


class PreparedWorktrees:
    """Makes, hands over and removes prepared worktrees. ``create`` has the signature of
    ``Worktrees.create`` and is what the pool calls to get a task's worktree."""

    def __init__(
        self,
        *,
        state: GridState,
        worktrees: Worktrees,
        background: Background,
        ahead: int,
        busy: Callable[[], AbstractSet[str]],
    ) -> None:
        self.state = state
        self.worktrees = worktrees
        self.background = background
        self.ahead = ahead
        self.busy = busy
        self.ready: dict[str, Worktree] = {}
        #: Per task, the preparation or removal under way (a start waits for it).
        self._inflight: dict[str, asyncio.Task[Any]] = {}
        self._wake = asyncio.Event()
        self._seen_revision = -1
        self.made = self.used = self.moved = self.discarded = 0
        state.on_change(self.wake)

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self.ahead > 0:
            self.background.supervise("worktree-preparer", self.run)

    async def run(self) -> None:
        await self.adopt()
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), TICK_SECONDS)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.reconcile()
            except Exception:  # one bad pass must not end the preparer
                log.exception("preparing worktrees failed; trying again")
                await asyncio.sleep(TICK_SECONDS)

    def limit(self) -> int:
        session = self.state.session
        return min(self.ahead, session.max_agents) if session.started else 0

    async def reconcile(self) -> None:
        """Remove what is no longer wanted, then make what is, one at a time."""
        revision = self.state.revision
        if revision == self._seen_revision and not self._inflight:
            return
        self._seen_revision = revision
        busy = self.busy()
        tasks = list(self.state.tasks.values())
        wanted = worth_preparing(tasks, busy=busy, limit=self.limit())
        session = self.state.session.started
        for task_id in list(self.ready):
            task = self.state.tasks.get(task_id)
            if not keeps(task, wanted=set(wanted), busy=busy, session=session):
                worktree = self.ready.pop(task_id, None)  # (a start may have taken it)
                if worktree is not None and owned(task, busy=self.busy()):
                    log.debug("the worktree of %s is its task's own now", task_id)
                elif worktree is not None:
                    await self._one(task_id, self._discard(worktree))
        for task_id in wanted:
            task = self.state.tasks.get(task_id)
            if task_id in self.ready or task is None or task.id in self.busy():
                continue
            if task.status not in (TaskStatus.READY, TaskStatus.PENDING) or task.branch:
                continue  # started (or changed) since the list was made
            if (self.worktrees.dir / task_id).exists():
                continue  # left from before; the start path deals with it
            await self._one(task_id, self._make(task_id))

    async def _one(self, task_id: str, work: Coroutine[Any, Any, None]) -> None:
        job = asyncio.create_task(work, name=f"prepare:{task_id}")
        self._inflight[task_id] = job
        try:
            await job  # (cancelled with it: git is terminated, never left behind)
        finally:
            if job.done():
                self._inflight.pop(task_id, None)

    async def _make(self, task_id: str) -> None:
        base_branch = self.state.session.feature_branch
        try:
            made = await self.worktrees.create(task_id, base_branch)
        except GitError as exc:  # the start will try (and report) again
            log.warning("could not prepare the worktree of %s: %s", task_id, exc.message)
            return
        self.ready[task_id] = made
        self.made += 1
        log.debug("prepared the worktree of %s at %s", task_id, made.base[:12])

    async def _discard(self, worktree: Worktree) -> None:
        if await self.worktrees.discard(worktree):
            self.discarded += 1
            log.info("removed the prepared worktree of %s (not needed)", worktree.task_id)
        else:  # never happens to a pristine one; kept rather than lose anything
            log.warning("kept the prepared worktree of %s: it holds work", worktree.task_id)

    # -- handing over ------------------------------------------------------------------------

    async def create(
        self, task_id: str, base_branch: str | None, *, known_base: str | None = None
    ) -> Worktree:
        """The task's worktree: its prepared one moved to the current tip when there is
        one, else ``Worktrees.create``'s."""
        if known_base is None:
            pending = self._inflight.get(task_id)
            if pending is not None:
                await asyncio.wait([pending])
            prepared = self.ready.pop(task_id, None)
            if prepared is not None:
                used = await self._use(prepared, base_branch)
                if used is not None:
                    return used
        return await self.worktrees.create(task_id, base_branch, known_base=known_base)

    async def _use(self, prepared: Worktree, base_branch: str | None) -> Worktree | None:
        wt = self.worktrees
        tip = await (wt.ensure_branch(base_branch) if base_branch else wt.head_commit())
        if tip != prepared.base:
            # A merge landed since: move the untouched worktree (and its branch) to the tip.
            moved = await git(prepared.path, "reset", "-q", "--hard", tip, check=False)
            if moved.code != 0:
                log.warning("could not move a prepared worktree: %s", moved.err.strip())
                await self._discard(prepared)
                return None
            self.moved += 1
        self.used += 1
        return Worktree(prepared.task_id, prepared.path, prepared.branch, tip)

    # -- after a restart ---------------------------------------------------------------------

    async def adopt(self) -> None:
        """Take on the worktrees an earlier daemon prepared: tasks that never ran (no branch
        recorded) whose worktree is on disk with nothing of its own on it."""
        if not self.worktrees.dir.is_dir():
            return
        for path in sorted(self.worktrees.dir.iterdir()):
            await self._one(path.name, self._adopt(path.name))
        self.wake()

    async def _adopt(self, task_id: str) -> None:
        # The scheduler runs already: a slot freed by a run that ended while no daemon was
        # up may start this very task now. Its start waits for this (``_one``), and a task
        # that started meanwhile (``Worktrees.create`` found the same worktree) is left
        # alone: adopting it would hand its live worktree to ``reconcile`` to remove.
        task = self.state.tasks.get(task_id)
        if task is None or owned(task, busy=self.busy()):
            return  # not a prepared one, or its start (after the restart) deals with it
        session = self.state.session
        base_branch = session.feature_branch if session.started else None
        found = await self.worktrees.pristine(task_id, base_branch)
        if found is not None and not owned(self.state.tasks.get(task_id), busy=self.busy()):
            self.ready[task_id] = found
