"""The merge train's decision (PURE): which of a batch's tasks to gate next, and whom to blame.

A batch is several approved tasks merged in order into one candidate and gated once. When
that gate fails, the batch is bisected to find the task (or tasks) that fail without the
others, and everyone else lands. The evidence is kept honest:

- Once ``suspects`` on the current tip are known to fail (the whole batch, first), their
  first half is gated alone. If it passes it lands, and the rest now sit on a tip that holds
  the first half: the very tree that failed, so they are still known to fail. If it fails,
  it is the new suspects and the rest go back to the queue (untested without the culprit:
  they ride in a later batch).
- A task that fails gated alone is the culprit: it goes back through the ``on_conflict``
  policy with the gate's output.
- A single suspect left by halves that passed is the culprit too when two failed runs held
  it (the batch's and a half's). When only the batch's first run did, that one run is all
  the evidence there is: the suspect is gated alone once more, the retry. A gate that failed
  by chance (flaky) blames nobody: the suspect passes then, lands, and the retry is counted.

For one bad task in ``n`` that is at most ``ceil(log2 n) + 2`` gate runs, the tasks sent
back to the queue included: the first run, at most ``ceil(log2 n)`` halvings, then either
the retry (no half failed, so nothing was sent back) or the batch of those sent back.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gate:
    """Gate these tasks (in order, on the current tip); ``retry``: a last suspect, alone."""

    tasks: list[str]
    retry: bool = False


@dataclass(frozen=True)
class Blame:
    """``task`` fails on the current tip without the others: back to the policy."""

    task: str


@dataclass
class Bisection:
    suspects: list[str]
    #: Whether ``suspects`` merged on the current tip are known to fail the gate.
    failing: bool = False
    #: Put back in the queue by the last failure (untested without the culprit).
    put_back: list[str] = field(default_factory=list)
    #: Failed runs that held every suspect.
    failures: int = 0

    def next(self) -> Gate | Blame | None:
        """The tasks to gate now, the culprit, or None: the train is through."""
        if not self.suspects:
            return None
        if self.failing and len(self.suspects) == 1:
            if self.failures >= 2:
                return Blame(self.suspects[0])
            return Gate(list(self.suspects), retry=True)  # evidence, or a flaky gate
        if self.failing:
            return Gate(self.suspects[: len(self.suspects) // 2])
        return Gate(list(self.suspects))

    def passed(self, part: list[str]) -> None:
        """``part`` passed the gate and landed."""
        self.suspects = self.suspects[len(part) :] if self.failing else []
        self.put_back = []

    def failed(self, part: list[str]) -> str | None:
        """``part`` failed the gate: the culprit, when it is a task gated alone."""
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
        """Tasks left the batch before any failure (a conflict): gate the rest as one."""
        self.suspects = list(tasks)
