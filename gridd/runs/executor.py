"""The executor seam: how the pool starts an agent's process, signals it, and finds it again.

The pool (``gridd/pool/``) and the scheduler above it never start a process themselves:
they hand a ``Launch`` to an ``Executor`` and get back an ``AgentHandle``. Two executors
implement it: the local shim executor (``runs/local.py`` over ``runs/process.py`` and
``runs/shim.py``: a detached supervisor per agent, outliving the daemon) and the remote
one (``runs/remote.py``: a box per run, e.g. a podman container, over one run protocol);
``runs/executors.py`` sends each launch to the one its profile names. Another engine
implements the same two protocols (or ``runs/boxes.py``'s ``Engine``) and plugs in at the
composition root (``grid.py``), with no change to the scheduler or the pool.

A handle names the agent by (pid, create time) and its supervisor likewise; the run
directory holds what the agent writes (output, heartbeats, ``exit.json``), which is what the
pool watches whatever runs the agent.

Spawning is idempotent across daemon restarts: the pool records the agent (the intent)
before ``spawn``. After a restart, an agent recorded without a pid is found running
(``reattach``), or fenced so that no late supervisor can start it any more (``fence`` is
True: the pool starts the task afresh), never both (``pool/reattaching.py`` decides).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gridd.errors import GriddError
from gridd.model import Agent
from gridd.runs.sandbox import Sandbox


class StartAbandoned(GriddError):
    """A spawn given up because a stop came first (``Executor.abandon_start``): the run
    never started and never will (its box, if one was made, is removed)."""

    code = "start_abandoned"


@dataclass
class ExitStatus:
    exit_code: int | None
    signal: int | None
    error: str | None = None
    #: Why the run ended, when its box's engine knows and it is not the agent's own doing
    #: (``Agent.exit_reason``, docs/executors.md): ``oom_killed``, ``deadline_exceeded``,
    #: ``evicted``, ``node_lost``, ``box_gone``.
    reason: str | None = None

    @property
    def code(self) -> int:
        """A shell-style status: the exit code, or 128 + signal."""
        if self.exit_code is not None:
            return self.exit_code
        return 128 + (self.signal or 0)


@dataclass(frozen=True)
class Launch:
    """What to run for one agent, and where its run directory is: a new one, made empty by
    the pool (``pool/rundirs.py``); a run directory is never reused."""

    run_dir: Path
    argv: list[str]
    cwd: Path
    env: dict[str, str] = field(repr=False)
    #: "pipe" (the pool may write to it), "null" or "inherit" (as the profile says).
    stdin: str = "pipe"
    #: Where it runs: "local", or a box engine's name (``runs/executors.py``).
    executor: str = "local"
    #: What the kernel lets the agent touch (None: no sandbox). An executor that cannot
    #: enforce it raises ``GriddError`` (code ``sandbox_unavailable``): never unconfined.
    sandbox: Sandbox | None = None
    #: The profile's changes to its box (``AgentProfile.box_options``: a Job's image and
    #: resources); the box's engine reads them, the others have none.
    box: dict[str, Any] = field(default_factory=dict)


class AgentHandle(Protocol):
    """One agent's process (and its supervisor), as the pool sees it."""

    run_dir: Path
    pid: int | None
    create_time: float | None
    shim_pid: int | None
    shim_create_time: float | None
    #: Where a run in a box was placed once it started (``Engine.where``: its node, its
    #: pod); empty on this machine.
    where: dict[str, str]

    def exit_status(self) -> ExitStatus | None: ...

    def alive(self) -> bool: ...

    def group_alive(self) -> bool: ...

    def shim_alive(self) -> bool: ...

    def signal(self, sig: int) -> bool: ...

    def handles_signal(self, sig: int) -> bool:
        """Whether the agent catches or ignores ``sig``, so that it may go on, or exit with
        a code of its own, after it (``pool/stopping.py``). Read where the agent runs (its
        pid may be another machine's or a container's); True when that cannot be told."""
        ...

    def close_stdin(self) -> bool: ...

    def write_stdin(self, text: str) -> None: ...


def running_fields(agent: Agent, handle: AgentHandle) -> dict[str, Any]:
    """What ``agent``'s record says of its run once ``handle`` has it running: the agent's
    and its supervisor's (pid, create time), and for a run in a box where it was placed
    (``AgentHandle.where``, merged into ``Agent.executor``)."""
    fields: dict[str, Any] = {
        "pid": handle.pid,
        "create_time": handle.create_time,
        "shim_pid": handle.shim_pid,
        "shim_create_time": handle.shim_create_time,
    }
    if agent.executor:
        fields["executor"] = {**agent.executor, **handle.where}
    return fields


class Executor(Protocol):
    """Starts, signals (through the handles it returns) and reattaches agents."""

    def start(self) -> None:
        """Get ready to spawn (e.g. start helpers ahead of need). After ``recover``."""

    def close(self) -> None:
        """Release what ``start`` holds; running agents are left running."""

    async def spawn(self, launch: Launch) -> AgentHandle:
        """Start the agent and return once it runs (or has already failed: its
        ``exit_status`` then says why). Raises ``GriddError`` or ``OSError`` when it could
        not be started at all; a spawn given up on (too slow) is fenced first, so that its
        run can never start later: the pool may start the task again at once."""

    def reattach(self, agent: Agent) -> AgentHandle:
        """The handle of an agent started by an earlier daemon. When the record has no pid
        (that daemon died while spawning), the handle is the run's, if it started; its
        ``pid`` stays None when it did not (yet)."""

    def abandon_start(self, run_dir: Path) -> None:
        """A stop (a cancel) came while the run's ``spawn`` is in flight: give the spawn up
        if the run has not started (``spawn`` then raises ``StartAbandoned``, its box
        removed); a run already started is stopped as any other, through the handle its
        ``spawn`` returns. Called on the event loop, at each scheduler pass until the spawn
        ends: it never blocks, and asking twice is asking once."""

    def fence(self, run_dir: Path) -> bool:
        """Make sure a run that has not started never will: True when it is fenced (the
        pool may start the task afresh, in a new run), False when its supervisor already
        took it (it runs, or is about to: reattach it once it says so)."""
