"""The merge train's decision (PURE): which of a batch's tasks to gate next, and whom to blame.

A batch is several approved tasks merged in order and gated. With ``slots`` gates at once
(``[merge] gate_concurrency``) it rides as a chain of candidates, each built on the one
ahead of it (Zuul's dependent pipeline): candidate ``i`` holds the tasks of parts 1..i, so
every candidate is a prefix of the batch. They are gated side by side and land in order;
a candidate fails only when every one ahead of it passed, and the ones behind it are
discarded (they hold its tasks). With one slot, the chain is one candidate.

When a candidate fails, its part is bisected to find the task (or tasks) that fail without
the others, and everyone else lands. The evidence is kept honest:

- Once ``suspects`` on the current tip are known to fail (a failed candidate's part, first),
  they are cut into ``slots + 1`` parts and the first ``slots`` prefixes gated as a chain
  (the whole is not gated again: it is known to fail). Prefixes that pass land, and the rest
  now sit on a tip that holds them: the very tree that failed, so they are still known to
  fail. The first prefix that fails makes its last part the new suspects, and the tasks
  behind it go back to the queue (untested without the culprit: they ride in a later
  batch). With one slot that is halving.
- A task that fails gated alone (a part of one task on the tip) is the culprit: it goes
  back through the ``on_conflict`` policy with the gate's output.
- A single suspect left by prefixes that passed is the culprit too when two failed runs
  held it. When only one did, that one run is all the evidence there is: the suspect is
  gated alone once more, the retry. A gate that failed by chance (flaky) blames nobody: the
  suspect passes then, lands, and the retry is counted.

For one bad task in ``n`` with one slot that is at most ``ceil(log2 n) + 2`` gate runs, the
tasks sent back to the queue included: the first run, at most ``ceil(log2 n)`` halvings,
then either the retry (no half failed, so nothing was sent back) or the batch of those
sent back. With ``s`` slots each round cuts the suspects into ``s + 1``: at most
``ceil(log_(s+1) n) + 2`` rounds of gates run side by side.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gate:
    """Gate these parts, each a candidate built on the one ahead (the first on the current
    tip); ``retry``: a last suspect, alone."""

    parts: list[list[str]]
    retry: bool = False

    @property
    def tasks(self) -> list[str]:
        return [task for part in self.parts for task in part]


@dataclass(frozen=True)
class Blame:
    """``task`` fails on the current tip without the others: back to the policy."""

    task: str


def cut(tasks: list[str], parts: int) -> list[list[str]]:
    """``tasks`` in ``parts`` runs of near-equal length, in order, the shorter ones first."""
    n = len(tasks)
    parts = max(1, min(parts, n))
    bounds = [i * n // parts for i in range(parts + 1)]
    return [tasks[a:b] for a, b in itertools.pairwise(bounds)]


@dataclass
class Bisection:
    suspects: list[str]
    #: Gates run side by side: candidates in a chain.
    slots: int = 1
    #: Whether ``suspects`` merged on the current tip are known to fail the gate.
    failing: bool = False
    #: Put back in the queue by the last failure (untested without the culprit).
    put_back: list[str] = field(default_factory=list)
    #: Failed runs that held every suspect.
    failures: int = 0

    def next(self) -> Gate | Blame | None:
        """The parts to gate now, the culprit, or None: the train is through."""
        if not self.suspects:
            return None
        if self.failing and len(self.suspects) == 1:
            if self.failures >= 2:
                return Blame(self.suspects[0])
            return Gate([list(self.suspects)], retry=True)  # evidence, or a flaky gate
        if self.failing:  # the whole is known to fail: its prefixes are gated
            return Gate(cut(self.suspects, self.slots + 1)[:-1])
        return Gate(cut(self.suspects, self.slots))

    def passed(self, part: list[str]) -> None:
        """``part``, the first of the suspects, passed the gate and landed."""
        self.suspects = self.suspects[len(part) :]
        self.put_back = []

    def failed(self, part: list[str]) -> str | None:
        """``part``, the first of the suspects, failed the gate on the current tip: the
        culprit, when it is a task gated alone."""
        self.put_back = self.suspects[len(part) :]
        self.failures += 1
        if len(part) == 1:
            self.suspects = []
            return part[0]
        self.suspects = list(part)
        self.failing = True
        return None

    def blamed(self) -> None:
        self.suspects = []

    def restart(self, tasks: list[str]) -> None:
        """Tasks left the batch before any failure (a conflict): gate the rest."""
        self.suspects = list(tasks)
