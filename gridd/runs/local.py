"""The local shim executor: agents run on this machine, each under a detached shim.

The only ``Executor`` (``runs/executor.py``) today. A spawn hands the run to a shim
(``runs/shim.py``), started ahead of need by ``ShimStarter`` (``runs/starter.py``);
the shim outlives the daemon, so a restarted daemon reattaches to its agents from what the
run directory and the state database say. A run recorded but not yet started when a
daemon died is fenced through the shim's ``claim`` file: whoever creates it first, the shim
or the restarted daemon, owns the run. So is a spawn the daemon gave up on (its agent did
not start within ``spawn_timeout``): a shim server that was stopped or slow can never start
it later.
"""

from __future__ import annotations

from pathlib import Path

from gridd.errors import GriddError
from gridd.model import Agent
from gridd.runs import landlock
from gridd.runs.executor import AgentHandle, Launch
from gridd.runs.process import AgentProcess, ShimStarter, fence_run


class LocalExecutor:
    def __init__(
        self,
        runs_dir: Path,
        *,
        spawn_timeout: float = 10.0,
        grid_dir: Path | None = None,
        orphan_grace: float = 60.0,
        landlock_abi: int | None = None,
    ) -> None:
        self.shims = ShimStarter(runs_dir / "spare-shim.log")
        #: A spawn whose agent has not started by then is fenced (``AgentProcess.spawn``).
        self.spawn_timeout = spawn_timeout
        #: The workspace's ``.grid/``: a shim whose ``.grid/`` is deleted or replaced stops
        #: its agent ``orphan_grace`` seconds later and exits (``shim.WorkspaceWatch``).
        self.grid_dir = grid_dir
        self.orphan_grace = orphan_grace
        #: A ceiling on the kernel's Landlock ABI ([daemon] landlock_abi, a test seam).
        self.landlock_abi = landlock_abi
        self._kernel_abi: int | None = None  # asked once

    def sandbox_abi(self) -> int:
        """The Landlock ABI this executor can enforce (0: none)."""
        if self._kernel_abi is None:
            self._kernel_abi = landlock.usable_abi(self.landlock_abi)
        return self._kernel_abi

    def start(self) -> None:
        self.shims.start()

    def close(self) -> None:
        self.shims.close()

    async def spawn(self, launch: Launch) -> AgentHandle:
        sandbox = None
        if launch.sandbox is not None:
            abi = self.sandbox_abi()
            box = launch.sandbox
            from gridd.runs import (
                seatbelt,
            )  # here: only a sandboxed spawn asks, never an idle daemon

            if seatbelt.applies():  # macOS: sandbox-exec, whatever the network policy
                why = seatbelt.unavailable(box.mode, box.network)
            else:
                why = landlock.unavailable(box.mode, abi, box.network)
            if why is not None:
                undo = 'network = "allow"' if abi >= landlock.MIN_ABI else 'mode = "off"'
                raise GriddError(
                    f"sandbox_unavailable: {why}; the run does not start (the profile's"
                    f" [agents.<name>.sandbox] {undo} runs it without that)",
                    code="sandbox_unavailable",
                    details={"mode": box.mode, "network": box.network, "landlockAbi": abi},
                )
            launch.sandbox.make_missing()  # its TMPDIR; a CLI's state on its first run
            sandbox = launch.sandbox.spec(abi=self.landlock_abi)
        return await AgentProcess.spawn(
            launch.run_dir,
            argv=launch.argv,
            cwd=launch.cwd,
            env=launch.env,
            stdin=launch.stdin,
            timeout=self.spawn_timeout,
            starter=self.shims,
            grid_dir=self.grid_dir,
            orphan_grace=self.orphan_grace,
            sandbox=sandbox,
        )

    def reattach(self, agent: Agent) -> AgentHandle:
        run_dir = Path(agent.run_dir)
        if agent.pid is None:
            # That daemon died while the shim was starting: the shim may well run the agent.
            adopted = AgentProcess.adopt(run_dir, not_before=agent.started_at.timestamp())
            if adopted is not None:
                return adopted
        return AgentProcess(
            run_dir,
            agent.pid,
            agent.create_time,
            shim_pid=agent.shim_pid,
            shim_create_time=agent.shim_create_time,
        )

    def abandon_start(self, run_dir: Path) -> None:
        """Nothing: a local spawn ends within ``spawn_timeout_seconds``, and its agent is
        stopped through its handle then."""

    def fence(self, run_dir: Path) -> bool:
        """Take the run's ``claim`` before any shim does (then none will start it), or find
        that its shim took it first."""
        return fence_run(run_dir, "recorded but not started when a daemon restarted")
