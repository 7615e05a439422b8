"""Run directories: each agent gets a new, empty ``runs/<agent-id>/``, never one that exists.

Agent numbers come from a counter in the state database, but the run directories outlive
it: a database set aside as corrupt (a new one starts the counter again), or a ``.grid/``
copied from elsewhere, leaves ``runs/`` holding directories that no record names. An agent
given one of them would find the old run's ``exit.json`` and report it as its own result,
and would overwrite the old ``spec.json``; gridd never overwrites or deletes a run. So the
directory is made here, exclusively, before the agent is recorded, and an id whose
directory exists is skipped: the counter jumps past every numbered run on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Counter(Protocol):
    def next_counter(self, name: str, *, past: int = 0) -> int: ...


def highest_run_number(runs_dir: Path) -> int:
    """The largest ``N`` among ``runs/<profile>-<N>`` entries (0 when none, or unreadable)."""
    highest = 0
    try:
        names = [entry.name for entry in runs_dir.iterdir()]
    except OSError:
        return 0
    for name in names:
        _, _, number = name.rpartition("-")
        if number.isascii() and number.isdigit():
            highest = max(highest, int(number))
    return highest


def new_run(counter: Counter, runs_dir: Path, profile: str) -> tuple[str, Path]:
    """A new agent id for ``profile`` and its run directory, created empty (0700).

    A directory that cannot be made for another reason (``runs/`` gone or not a directory)
    is left to the executor's spawn, which fails the attempt with that reason."""
    past = 0
    while True:
        agent_id = f"{profile}-{counter.next_counter('agent', past=past)}"
        run_dir = runs_dir / agent_id
        try:
            run_dir.mkdir(mode=0o700)
        except FileExistsError:
            past = highest_run_number(runs_dir)
            continue
        except OSError:
            pass
        return agent_id, run_dir
