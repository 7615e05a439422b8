"""The remote executor: each run in a box of its own (a container, a pod), one protocol.

An ``Executor`` (``runs/executor.py``) over an ``Engine`` (``runs/boxes.py``). A spawn:

1. writes ``remote.json`` into the (local, new) run directory: which box, which worktree;
2. bundles the task's branch (``git bundle``: the repository in, no credentials needed);
3. creates the box named after the run, with the bundle, the spec and the in-box shim
   (``runs/boxshim.py``). Creating it is the claim: a name taken fails the spawn, so a
   run never has two copies. The shim clones the bundle and starts the agent. An engine
   that puts the run in after making the box (a Job's pod, once it runs) has
   ``remote.in`` written durably once it is in: a restarted daemon removes a box found
   without it (``fence``), since nothing will ever put its run in;
4. waits for the shim's ``agent.json`` (or its ``exit.json``), as the local executor does:
   heard from the shim's news where the engine keeps it on this machine
   (``boxes.Announcing``: a file read), else (or when the news is slow to come) from the
   mirror's looks.

From then on one thread keeps every run's mirror (``runs/mirror.py``): output and
heartbeats copied by offset, and ``exit.json`` written last, once the output is drained
and the result branch is in the task's worktree. Then the box is removed. Stdin goes to
the box's inbox (``write_stdin``: numbered messages, queued in the run's ``outbox/`` and
put in by the mirror's thread, each once); a signal is the shim's ``signal`` command (the
pool sends it off the event loop). A restarted daemon finds a run's box again by its name
(``reattach``) and the mirror resumes from the sizes its files have.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gridd.errors import Conflict, GriddError
from gridd.model import Agent
from gridd.runs.boxes import Announcing, BoxError, BoxGone, Engine
from gridd.runs.executor import AgentHandle, ExitStatus, Launch
from gridd.runs.mirror import RunMirror

log = logging.getLogger(__name__)

#: How often the mirror looks at each running box.
LOOK_SECONDS = 0.1
#: A spawn listening to the shim's news also has the mirror look (an exec: it sees a box
#: that stopped without a word) once it has heard nothing for this long.
NEWS_SECONDS = 1.0
#: How often a spawn checks for the shim's news, or for what the mirror saw.
SPAWN_POLL_SECONDS = 0.01
REMOTE = "remote.json"
#: Written durably beside ``remote.json`` once the run is in its box, by an engine whose run
#: goes in after the box is made (``Engine.input_after_create``): a box found without it
#: after a restart never got its run (``fence``).
PUT_IN = "remote.in"


class RemoteSpawnError(GriddError):
    code = "spawn_failed"
    transient = True


def box_name(workspace: Path, run_dir: Path) -> str:
    """The run's box: the run's name, with the workspace's (boxes of several workspaces
    share an engine)."""
    tag = hashlib.sha256(str(workspace).encode()).hexdigest()[:8]
    return f"grid-{tag}-{run_dir.name}"


def placement(executor: str, workspace: Path, run_dir: Path) -> dict[str, str] | None:
    """Where a run executes, as ``Agent.executor`` shows it: None on this machine."""
    if executor == "local":
        return None
    return {"kind": executor, "box": box_name(workspace, run_dir)}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


class RemoteHandle:
    """One run in a box, as the pool sees it: through its mirror."""

    shim_pid: int | None = None
    shim_create_time: float | None = None

    def __init__(self, mirror: RunMirror, wake: Callable[[], None]) -> None:
        self.mirror = mirror
        self.run_dir = mirror.run_dir
        self._wake = wake  # the mirror's thread, to put a queued message in at once
        self.where: dict[str, str] = {}
        self.pid: int | None = None
        self.create_time: float | None = None
        self._pick_up()

    def _pick_up(self) -> None:
        agent = self.mirror.agent
        if self.pid is None and agent is not None:
            self.pid = int(agent["pid"])
            self.create_time = float(agent["startedAt"])

    def exit_status(self) -> ExitStatus | None:
        try:
            data = json.loads(self.mirror.exit_path().read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return ExitStatus(
            data.get("exitCode"), data.get("signal"), data.get("error"), data.get("reason")
        )

    def alive(self) -> bool:
        self._pick_up()
        return self.pid is not None and self.mirror.running and not self.mirror.done

    def group_alive(self) -> bool:
        return self.alive()

    def shim_alive(self) -> bool:
        """The box is there (or its result is still being brought in)."""
        return self.mirror.lost is None

    def signal(self, sig: int) -> bool:
        if not self.alive():
            return False
        try:
            return self.mirror.engine.exec(self.mirror.box, ["signal", str(int(sig))]) == b"1\n"
        except (BoxGone, BoxError) as exc:
            log.warning("signal to box %s failed: %s", self.mirror.box, exc)
            return False

    def handles_signal(self, sig: int) -> bool:
        """Asked in the box: the agent's pid is the box's, not this machine's."""
        if sig == 9 or not self.alive():
            return False
        try:
            answer = self.mirror.engine.exec(self.mirror.box, ["handles", str(int(sig))])
        except (BoxGone, BoxError):
            return True
        return answer.strip() != b"0"

    def _put(self, data: bytes, kind: str) -> None:
        """Queued for the box's inbox (``RunMirror.queue``) and put in by the mirror's
        thread: never an exec on the event loop."""
        if self.mirror.lost is not None:
            raise Conflict(
                "the agent's box is gone; it is not reading its stdin",
                code="agent_not_listening",
            )
        self.mirror.queue(data, kind)
        self._wake()

    def close_stdin(self) -> bool:
        if not self.alive():
            return False
        self._put(b"", "close")
        return True

    def write_stdin(self, text: str) -> None:
        if self.exit_status() is not None or self.mirror.lost is not None:
            raise Conflict("the agent has exited", code="agent_not_listening")
        self._put((text if text.endswith("\n") else text + "\n").encode(), "msg")


class RemoteExecutor:
    """Runs each agent in a box of ``engine``; one thread mirrors them all."""

    def __init__(
        self,
        engine: Engine,
        *,
        workspace: Path,
        spawn_timeout: float = 30.0,
        labels: dict[str, str] | None = None,
        look_seconds: float = LOOK_SECONDS,
        environ: Mapping[str, str] | None = None,
        forward_env: Sequence[str] = (),
    ) -> None:
        self.look_seconds = look_seconds
        #: The daemon's own environment: none of it goes into a box but ``forward_env``.
        self.environ = dict(environ or {})
        self.forward_env = frozenset(forward_env)
        self.engine = engine
        self.workspace = workspace
        self.spawn_timeout = spawn_timeout
        self.labels = {"grid.workspace": hashlib.sha256(str(workspace).encode()).hexdigest()[:16]}
        self.labels |= labels or {}
        self.mirrors: dict[Path, RunMirror] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Nothing until a run needs the mirror (``_watch``): a daemon whose runs are all
        local has no mirror thread."""

    def _watch(self, mirror: RunMirror) -> None:
        with self._lock:
            self.mirrors[mirror.run_dir] = mirror
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="gridd-mirror", daemon=True)
                self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        self.engine.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            # Every look_seconds, or at once when a message waits in an outbox.
            self._wake.wait(self.look_seconds)
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._lock:
                mirrors = list(self.mirrors.values())
            for mirror in mirrors:
                self._look(mirror)

    def _look(self, mirror: RunMirror) -> None:
        try:
            while mirror.look():  # until nothing more is new: a flood is copied in a row
                if mirror.done or mirror.lost:
                    break
        except Exception:
            log.exception("mirror of %s failed", mirror.run_dir)
            return
        if not (mirror.done or mirror.lost):
            return
        if mirror.lost:
            # Stopped or gone without an exit record (an OOM of its main process, a lost
            # node): the watcher reports the run lost; what is left of the box goes.
            log.warning("box %s of %s is lost: %s", mirror.box, mirror.run_dir.name, mirror.lost)
        try:
            self.engine.remove(mirror.box)
        except BoxError as exc:  # kept for the next look: the thread must live on
            log.warning("could not remove box %s: %s", mirror.box, exc)
            return
        with self._lock:
            self.mirrors.pop(mirror.run_dir, None)

    # -- the seam ------------------------------------------------------------------------

    async def spawn(self, launch: Launch) -> AgentHandle:
        if launch.sandbox is not None:
            # The box is the isolation; Landlock is the local shim's. Never unconfined
            # silently: the profile asks for what this executor does not do.
            raise GriddError(
                f"the {self.engine.kind} executor has no Landlock sandbox; the box is the"
                " isolation: set the profile's sandbox mode to 'off'",
                code="sandbox_unavailable",
            )
        mirror = await asyncio.to_thread(self._create, launch)
        handle = RemoteHandle(mirror, self._wake.set)
        handle.where = self.engine.where(mirror.box)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.spawn_timeout
        news_of = self.engine.news if isinstance(self.engine, Announcing) else None
        news_by = loop.time() + NEWS_SECONDS
        try:
            while handle.pid is None and handle.exit_status() is None:
                if news_of is not None:
                    news = news_of(mirror.box)
                    if news is not None or loop.time() > news_by:
                        if news is not None and isinstance(news.get("agent"), dict):
                            mirror.heard(news["agent"])
                        # From here on the mirror's looks copy the run (and see it end).
                        news_of = None
                        self._watch(mirror)
                        self._wake.set()
                        handle._pick_up()
                        continue
                elif mirror.lost is not None or not mirror.running:
                    await asyncio.to_thread(self._forget, mirror)
                    raise RemoteSpawnError(
                        f"box {mirror.box} stopped before its agent started: {mirror.lost}",
                        details={"runDir": str(launch.run_dir)},
                    )
                if loop.time() > deadline:
                    # Given up on: the box goes, so that it can never start the agent later.
                    await asyncio.to_thread(self._forget, mirror)
                    raise RemoteSpawnError(
                        f"box {mirror.box} did not start the agent within"
                        f" {self.spawn_timeout:g}s; it is removed",
                        details={"runDir": str(launch.run_dir)},
                    )
                await asyncio.sleep(SPAWN_POLL_SECONDS)
                handle._pick_up()
        except asyncio.CancelledError:
            self._watch(mirror)  # the box runs on: mirrored, and removed once it ends
            raise
        if news_of is not None:  # the looks tell the rest
            self._watch(mirror)
            self._wake.set()
        return handle

    def _create(self, launch: Launch) -> RunMirror:
        worktree = launch.cwd
        base, _, branch = _git(worktree, "rev-parse", "HEAD", "--abbrev-ref", "HEAD").partition(
            "\n"
        )
        if branch == "HEAD":
            raise RemoteSpawnError(f"the task's worktree {worktree} is on no branch")
        name = box_name(self.workspace, launch.run_dir)
        launch.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        remote = {
            "engine": self.engine.kind,
            "box": name,
            "worktree": str(worktree),
            "branch": branch,
            "base": base,
        }
        with open(launch.run_dir / REMOTE, "x") as fh:  # a run directory is never reused
            json.dump(remote, fh)
        bundle = subprocess.run(
            ["git", "-C", str(worktree), "bundle", "create", "-q", "-", branch],
            check=True,
            capture_output=True,
        ).stdout
        spec = {
            "argv": launch.argv,
            "env": self.box_env(launch.env),
            "stdin": launch.stdin,
            "branch": branch,
            "base": base,
        }
        labels = self.labels | {"grid.run": launch.run_dir.name}
        task = launch.env.get("GRID_TASK_ID")
        if task:
            labels["grid.task"] = task
        try:
            self.engine.create(
                name,
                labels=labels,
                files={"spec.json": json.dumps(spec).encode(), "base.bundle": bundle},
                options=launch.box,
            )
        except BoxError as exc:
            raise RemoteSpawnError(f"could not create box {name}: {exc.message}") from exc
        if self.engine.input_after_create:
            _write_durably(launch.run_dir / PUT_IN)
        # An engine with news: the spawn hears the agent start there, before any look.
        return self._mirror(launch.run_dir, remote, look=not isinstance(self.engine, Announcing))

    def box_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """What of a launch's environment goes into the box: gridd's ``GRID_*``, what the
        profile sets, and the names configured to pass (``env``); never the rest of the
        daemon's own environment (its PATH, HOME, keys: the box has its own, and secrets
        go by reference)."""
        return {
            k: v
            for k, v in env.items()
            if k.startswith("GRID_") or k in self.forward_env or self.environ.get(k) != v
        }

    def _mirror(self, run_dir: Path, remote: dict[str, str], *, look: bool = True) -> RunMirror:
        """The run's mirror; with ``look``, looked at once and watched from then on."""
        mirror = RunMirror(
            run_dir=run_dir,
            engine=self.engine,
            box=remote["box"],
            worktree=Path(remote["worktree"]),
            branch=remote["branch"],
            base=remote["base"],
        )
        if look:
            mirror.look()
            self._watch(mirror)
        return mirror

    def _forget(self, mirror: RunMirror) -> None:
        with self._lock:
            self.mirrors.pop(mirror.run_dir, None)
        self.engine.remove(mirror.box)

    def abandon_start(self, run_dir: Path) -> None:
        """The engine gives up creating the run's box (``Engine.abandon``)."""
        self.engine.abandon(box_name(self.workspace, run_dir))

    def reattach(self, agent: Agent) -> AgentHandle:
        run_dir = Path(agent.run_dir)
        try:
            remote = json.loads((run_dir / REMOTE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            remote = None
        if remote is None:
            mirror = RunMirror(
                run_dir=run_dir, engine=self.engine, box="", worktree=run_dir, branch="", base=""
            )
            mirror.lost = "the daemon died before it made the run's box"
            mirror.running = False
            return RemoteHandle(mirror, self._wake.set)
        with self._lock:
            known = self.mirrors.get(run_dir)
        mirror = known or self._mirror(run_dir, remote)
        return RemoteHandle(mirror, self._wake.set)

    def fence(self, run_dir: Path) -> bool:
        """A run recorded but not known to run: its box, if there is one, runs it (False);
        otherwise none ever will, since only this daemon creates boxes (True).

        A box whose run goes in after its create (``Engine.input_after_create``: a Job)
        and that was never put in (no ``PUT_IN``, no agent heard of) will never run it: the
        daemon that would have put it in died. It is removed (True), so that its task
        starts afresh at once instead of waiting for the box's bootstrap to give up. A
        daemon killed after the put-in but before ``PUT_IN`` was written loses that run
        the same way: its agent, moments old, goes with its box and nothing of it is
        recorded; so a run never has two copies."""
        name = box_name(self.workspace, run_dir)
        if self.engine.info(name) is None:
            return True
        if not self.engine.input_after_create:
            return False
        if (run_dir / PUT_IN).exists() or (run_dir / "agent.json").exists():
            return False
        log.warning("box %s never got its run (the daemon died first): removed", name)
        with self._lock:  # reattach's mirror, looking at a box that goes
            self.mirrors.pop(run_dir, None)
        self.engine.remove(name)
        return True


def _write_durably(path: Path) -> None:
    """An empty file, there for good before this returns (the file and its directory
    synced)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
