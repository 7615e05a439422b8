"""The conflict radar: which live tasks touch the same files, and which would conflict.

For each live task (working, in review, merging, rate limited: work not yet merged) the
radar keeps the files it changed against its base: committed (``git diff --name-only
base HEAD``) and not yet committed (``git status``). It reports overlaps between live
tasks, and between a live task and what landed on the feature branch since the task
branched, and predicts real textual conflicts with ``git merge-tree --write-tree`` (no
worktree touched) from the branches' heads.

Cheap by construction: a worktree is re-read only when its agent did something since the
last look (new output, or a change of status; heartbeats alone are not work) and
``radar_seconds`` have passed, once more when it goes quiet, when its branch moved, or now
and then otherwise (hand edits, or an agent that edits without printing): first
``IDLE_FACTOR * radar_seconds`` after the last look, doubling while nothing changes up to
``IDLE_MAX_FACTOR * radar_seconds``. So a daemon whose agents only send heartbeats is at rest:
one ``for-each-ref`` per sweep and no per-worktree git. Predictions are cached by the pair of
commits, and a branch's committed files by its base and head.

**A budget.** However many agents print, a sweep re-reads at most ``looks_per_second *
radar_seconds`` worktrees (``[merge] radar_looks_per_second``): the ones never read or whose
branch moved first, then those waiting longest. With hundreds of busy agents each worktree
is read less often; the daemon's git work, and so its CPU, stays bounded. The decisions
(``overlaps``, ``held``, ``rescan_due``, ``pick``) are pure functions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gridd.background import Background
from gridd.events import EventBus
from gridd.git.worktrees import git
from gridd.model import Agent, ConflictItem, Task, TaskStatus
from gridd.state import GridState

log = logging.getLogger(__name__)

LIVE = frozenset(
    {TaskStatus.WORKING, TaskStatus.REVIEW, TaskStatus.MERGING, TaskStatus.RATE_LIMITED}
)
#: A quiet worktree is still re-read this many radar periods after its last look (edits
#: made by hand, or by an agent that prints nothing), the gap doubling while nothing changes
IDLE_FACTOR = 10
#: ... up to this many radar periods.
IDLE_MAX_FACTOR = 100
#: Cached diffs and predictions kept before the caches start over.
CACHE_LIMIT = 4096


@dataclass
class Seen:
    """What the radar knows of one live task."""

    files: frozenset[str] = frozenset()
    head: str | None = None  # the branch head (committed work) at the last look
    activity: object = None  # the agent's activity fingerprint at the last look
    scanned: float = 0.0  # monotonic
    quiet_rescanned: bool = True
    idle_gap: float = 0.0  # the wait before the next idle look (0: IDLE_FACTOR periods)


# -- decisions (PURE) -----------------------------------------------------------------------


def overlaps(
    changed: Mapping[str, frozenset[str]], landed: Mapping[str, frozenset[str]]
) -> list[tuple[str, tuple[str, ...], list[str]]]:
    """(kind, task ids, files) for every pair of live tasks changing the same files
    (kind ``tasks``) and every live task changing files that landed on the feature branch
    since it branched (kind ``feature``)."""
    found: list[tuple[str, tuple[str, ...], list[str]]] = []
    ids = sorted(changed)
    # Through the files, not every pair of tasks: hundreds of live tasks that share
    # nothing cost one pass over their files, not tens of thousands of intersections.
    owners: dict[str, list[str]] = {}
    for task_id in ids:
        for path in changed[task_id]:
            owners.setdefault(path, []).append(task_id)  # in ``ids`` order
    shared: dict[tuple[str, str], list[str]] = {}
    for path, tasks in owners.items():
        for i, a in enumerate(tasks):
            for b in tasks[i + 1 :]:
                shared.setdefault((a, b), []).append(path)
    for pair in sorted(shared):
        found.append(("tasks", pair, sorted(shared[pair])))
    for task_id in ids:
        common = changed[task_id] & landed.get(task_id, frozenset())
        if common:
            found.append(("feature", (task_id,), sorted(common)))
    return found


def held(tasks: Iterable[Task], changed: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """Ready tasks whose declared ``files`` overlap what a live task changes or declares."""
    tasks = list(tasks)
    busy: set[str] = set()
    for task in tasks:
        if task.status in LIVE:
            busy |= changed.get(task.id, frozenset()) | set(task.files)
    return frozenset(
        t.id for t in tasks if t.status == TaskStatus.READY and t.files and busy & set(t.files)
    )


async def uncommitted(path: Path) -> frozenset[str]:
    """Files changed but not committed in a worktree, read without writing to it: plain
    ``git status`` refreshes the index under ``index.lock``, which would make the agent's
    own git, or the merge queue's commit in that worktree, fail while the radar looks."""
    status = await git(
        path,
        "--no-optional-locks",
        "status",
        "--porcelain",
        "-z",
        "--untracked-files=all",
        "--no-renames",
        check=False,
    )
    return frozenset(entry[3:] for entry in status.out.split("\0") if len(entry) > 3)


def activity_of(agent: Agent | None) -> object:
    """What counts as an agent doing something: new output or a change of status. A
    heartbeat (and the label it carries) only says the agent is alive; counting it made
    every heartbeat-only agent's worktree re-read with git every period."""
    return (agent.id, agent.output_seq, agent.status) if agent else None


def rescan_due(
    seen: Seen, *, head: str | None, activity: object, now: float, period: float
) -> bool:
    """Whether to re-read a worktree now; updates ``seen``'s quiet bookkeeping (PURE: no
    I/O, the clock is passed in)."""
    due = now - seen.scanned >= period
    if seen.scanned == 0.0 or head != seen.head:
        return True
    if activity != seen.activity:
        seen.quiet_rescanned = False
        seen.idle_gap = 0.0
        return due
    if not seen.quiet_rescanned:
        seen.quiet_rescanned = due  # it went quiet: one more look at what it left
        return due
    return now - seen.scanned >= (seen.idle_gap or IDLE_FACTOR * period)


def pick(due: Iterable[tuple[str, Seen, bool]], budget: int) -> list[str]:
    """Which due worktrees to read this sweep, at most ``budget``: ``due`` holds (task id,
    what is known, whether its branch moved); never-read and moved ones go first, then the
    longest unread (PURE)."""
    ranked = sorted(due, key=lambda d: (not (d[1].scanned == 0.0 or d[2]), d[1].scanned, d[0]))
    return [task_id for task_id, _seen, _moved in ranked[: max(1, budget)]]


def item_id(kind: str, tasks: tuple[str, ...]) -> str:
    return f"{kind}:{'+'.join(tasks)}"


# -- the loop -----------------------------------------------------------------------------------


@dataclass
class Radar:
    state: GridState
    bus: EventBus
    root: Path
    background: Background
    period: float = 3.0
    looks_per_second: float = 2.0
    seen: dict[str, Seen] = field(default_factory=dict)
    items: dict[str, ConflictItem] = field(default_factory=dict)
    _predictions: dict[tuple[str, str], list[str] | None] = field(default_factory=dict)
    _landed: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    _committed: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    scans: int = 0
    deferred: int = 0  # due looks left for a later sweep by the budget
    clock: Callable[[], float] = time.monotonic

    def start(self) -> None:
        self.background.supervise("conflict-radar", self.run)

    async def run(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:  # one bad sweep must not end the radar
                log.exception("conflict radar sweep failed; next one in %gs", self.period)
            await asyncio.sleep(self.period)

    def changed(self) -> dict[str, frozenset[str]]:
        return {task_id: seen.files for task_id, seen in self.seen.items()}

    async def sweep(self) -> None:
        live = {t.id: t for t in self.state.tasks.values() if t.status in LIVE and t.branch}
        for gone in set(self.seen) - set(live):
            del self.seen[gone]
        if not live and not self.items:
            return
        heads = await self._heads()
        now = self.clock()
        due: list[tuple[str, Seen, bool]] = []
        for task in live.values():
            head = heads.get(task.branch or "")
            seen = self.seen.setdefault(task.id, Seen(quiet_rescanned=False))
            kept = (seen.quiet_rescanned, seen.idle_gap)
            activity = activity_of(self.state.agent_for_task(task.id))
            if rescan_due(seen, head=head, activity=activity, now=now, period=self.period):
                due.append((task.id, seen, head != seen.head))
                seen.quiet_rescanned, seen.idle_gap = kept  # settled by the look itself
        chosen = pick(due, round(self.looks_per_second * self.period)) if due else []
        self.deferred += len(due) - len(chosen)
        for task_id in chosen:
            task = live[task_id]
            await self._look(task, heads.get(task.branch or ""), now)
        feature = self.state.session.feature_branch
        tip = heads.get(feature) if feature else None
        landed: dict[str, frozenset[str]] = {}
        if tip is not None:
            for task in live.values():
                seen = self.seen[task.id]
                if seen.head is not None and seen.files and task.base_commit != tip:
                    landed[task.id] = await self._landed_files(seen.head, tip)
        found: dict[str, ConflictItem] = {}
        for kind, ids, files in overlaps(self.changed(), landed):
            pair = [self.seen[i].head for i in ids]
            other = tip if kind == "feature" else pair[1] if len(pair) > 1 else None
            predicted = None
            if pair[0] and other:
                predicted = await self._predict(pair[0], other)
            item = ConflictItem(
                id=item_id(kind, ids),
                kind=kind,
                tasks=list(ids),
                files=files,
                predicted_conflict=bool(predicted),
                conflict_files=predicted or [],
                feature_commit=tip if kind == "feature" else None,
            )
            found[item.id] = item
        self._publish(found)

    def _publish(self, found: dict[str, ConflictItem]) -> None:
        changed = False
        for key, item in found.items():
            old = self.items.get(key)
            if old is None or old.model_dump(exclude={"feature_commit"}) != item.model_dump(
                exclude={"feature_commit"}
            ):
                self.bus.publish("conflict.detected", item.wire())
                changed = True
        for key in set(self.items) - set(found):
            gone = self.items[key]
            self.bus.publish(
                "conflict.cleared", {"id": key, "kind": gone.kind, "tasks": gone.tasks}
            )
            changed = True
        self.items = found
        if changed:
            self.state.touch()  # the hold policy may release (or hold) a task

    async def _heads(self) -> dict[str, str]:
        """Every branch's commit, in one git call."""
        res = await git(
            self.root,
            "for-each-ref",
            "--format=%(objectname) %(refname:strip=2)",
            "refs/heads/",
            check=False,
        )
        heads: dict[str, str] = {}
        for line in res.out.splitlines():
            sha, _, name = line.partition(" ")
            heads[name] = sha
        return heads

    async def _look(self, task: Task, head: str | None, now: float) -> None:
        """Re-read one worktree (the sweep decided it is due)."""
        seen = self.seen[task.id]
        activity = activity_of(self.state.agent_for_task(task.id))
        idle = seen.quiet_rescanned and activity == seen.activity and head == seen.head
        rescan_due(seen, head=head, activity=activity, now=now, period=self.period)
        seen.activity, seen.head, seen.scanned = activity, head, now
        self.scans += 1
        files: set[str] = set()
        if task.base_commit and head:
            files |= await self._committed_files(task.base_commit, head)
        path = Path(task.worktree) if task.worktree else None
        if path is not None and (path / ".git").exists():
            files |= await uncommitted(path)
        found = frozenset(files)
        if idle and found == seen.files:  # nothing changed by hand: look less often
            gap = 2 * (seen.idle_gap or IDLE_FACTOR * self.period)
            seen.idle_gap = min(gap, IDLE_MAX_FACTOR * self.period)
        else:
            seen.idle_gap = 0.0
        seen.files = found

    async def _committed_files(self, base: str, head: str) -> frozenset[str]:
        """Files a branch changed from ``base`` to ``head`` (cached: commits do not change)."""
        key = (base, head)
        if len(self._committed) > CACHE_LIMIT:
            self._committed.clear()
        if key not in self._committed:
            diff = await git(self.root, "diff", "--name-only", "-z", base, head, "--", check=False)
            self._committed[key] = frozenset(f for f in diff.out.split("\0") if f)
        return self._committed[key]

    async def _landed_files(self, head: str, tip: str) -> frozenset[str]:
        """Files the feature branch changed since it and the task's branch last met (the
        task's own merged work is not "landed" against it)."""
        key = (head, tip)
        if len(self._landed) > CACHE_LIMIT:
            self._landed.clear()
        if key not in self._landed:
            fork = await git(self.root, "merge-base", head, tip, check=False)
            base = fork.out.strip()
            files: frozenset[str] = frozenset()
            if base and base != tip:
                files = await self._committed_files(base, tip)
            self._landed[key] = files
        return self._landed[key]

    async def _predict(self, a: str, b: str) -> list[str] | None:
        """The files ``git merge-tree`` says would conflict (None: it merges cleanly)."""
        key = (min(a, b), max(a, b))
        if len(self._predictions) > CACHE_LIMIT:
            self._predictions.clear()
        if key not in self._predictions:
            res = await git(
                self.root,
                "merge-tree",
                "--write-tree",
                "--name-only",
                "--no-messages",
                a,
                b,
                check=False,
            )
            if res.code == 1:
                lines = [line for line in res.out.splitlines()[1:] if line]
                self._predictions[key] = sorted(set(lines)) or ["(unknown)"]
            else:
                self._predictions[key] = None
        return self._predictions[key]
