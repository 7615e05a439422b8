"""The composition root: lock the workspace, bind the socket, build the Grid, serve.

Order matters and is the point of this module:
1. ``flock`` on ``.grid/gridd.lock`` before anything else (one daemon per workspace);
2. config and database, failing loudly and early;
3. bind ``gridd.sock`` ourselves under umask 0o177, removing a leftover socket only when
   ``connect()`` proves nobody is behind it;
4. serve with uvicorn on that socket; write ``gridd.pid`` once it accepts connections;
5. on SIGTERM/SIGINT/``POST /shutdown``: start no more agents, end SSE streams, stop
   accepting, flush, remove the socket and pid file, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import logging.handlers
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Generator, Mapping
from pathlib import Path

from uvicorn.config import Config
from uvicorn.server import Server

from gridd import diskfault, lean, lockholder, trust
from gridd.adapters.registry import get_adapter
from gridd.api import create_app
from gridd.api.protocol import ConnectionGate, gridd_protocol
from gridd.compose import compose
from gridd.errors import AlreadyRunning, ConfigError, GriddError, WorkspaceError
from gridd.git.merge import PauseSeam
from gridd.grid import Grid
from gridd.runs.starter import SHIM_PATH
from gridd.settings import Settings, load_settings
from gridd.store import Store
from gridd.workspace import Workspace, find_workspace

log = logging.getLogger("gridd")


# -- single instance ------------------------------------------------------------------------


def acquire_lock(ws: Workspace) -> int:
    """Take the workspace lock or raise AlreadyRunning naming the holder: the pid written
    in the lock file, or the process the kernel says holds it when that is another one (a
    daemon of a version that wrote no pid, any program holding an ``flock`` on it)."""
    try:
        fd = os.open(ws.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise WorkspaceError(f"cannot open {ws.lock_path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            written = _read_holder_pid(fd)
        finally:
            os.close(fd)
        raise AlreadyRunning(str(ws.root), written, holder=_other_holder(ws, written)) from None
    # Written over the old pid, then cut to length: on a full disk a file truncated to
    # nothing first may not get its page back.
    line = f"{os.getpid()}\n".encode()
    try:
        os.pwrite(fd, line, 0)
        os.ftruncate(fd, len(line))
    except OSError as exc:
        os.close(fd)
        raise WorkspaceError(
            f"cannot start: cannot write {ws.lock_path} ({exc.strerror}); free some space"
            " (or make it writable) and start again",
            code="disk_full" if exc.errno == errno.ENOSPC else "workspace_error",
        ) from None
    return fd


def _other_holder(ws: Workspace, written: int | None) -> tuple[int, str] | None:
    """The live process the kernel says holds the lock, with its command line, when it
    is not the pid written in the lock file; None when they agree or it cannot be told
    (not Linux, released meanwhile, a holder in another pid namespace or gone)."""
    try:
        pid = lockholder.flock_holder(ws.lock_path)
    except OSError:
        return None
    if not pid or pid == written:
        return None
    command = lockholder.describe(pid)
    return None if command == "gone" else (pid, command)


def _read_holder_pid(fd: int, *, patience: float = 0.5) -> int | None:
    # The holder writes its pid right after winning the lock; a loser of a simultaneous
    # start may look in between, so give it a moment before saying "unknown".
    deadline = time.monotonic() + patience
    while True:
        try:
            return int(os.pread(fd, 32, 0).decode().strip())
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return None
        time.sleep(0.02)


def read_pid_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# -- the socket -----------------------------------------------------------------------------


def bind_socket(path: Path, *, backlog: int = 128) -> socket.socket:
    """Bind a 0600 Unix socket at ``path``; never steal a live one."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise WorkspaceError(
                f"{path} exists and is not a socket; remove it by hand if it is not needed",
                code="socket_path_occupied",
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            log.info("removing stale socket %s (nothing listening)", path)
            path.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise WorkspaceError(f"cannot probe existing socket {path}: {exc}") from None
        else:
            raise WorkspaceError(
                f"another process is serving {path}; refusing to replace a live socket",
                code="socket_in_use",
            )
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise WorkspaceError(f"cannot bind {path}: {exc.strerror}") from None
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


# -- configuration that needs more than pydantic ----------------------------------------------


def check_profiles(settings: Settings, *, source: str) -> None:
    """Every configured agent profile's adapter and its options, checked before anything
    starts. (The built-in profiles are known good: checking them would only load adapters
    that no agent may ever use.)"""
    for name, profile in settings.agents.items():
        try:
            get_adapter(profile.adapter, options=profile.adapter_options)
        except GriddError as exc:
            key = f"agents.{name}.adapter"
            raise ConfigError(
                f"{source}: invalid value for '{key}': {exc.message}",
                details={"source": source, "problems": [{"key": key, "problem": exc.message}]},
            ) from None


# -- logging ----------------------------------------------------------------------------------


class LogFile(logging.handlers.RotatingFileHandler):
    """``gridd.log``. A record the disk refuses (full, read-only) is still on stderr: the
    failure is said there in one line when it starts, not as a traceback per record."""

    def __init__(self, path: Path, *, max_bytes: int, backups: int) -> None:
        super().__init__(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self.failing = False
        self._failed = False

    def emit(self, record: logging.LogRecord) -> None:
        self._failed = False
        super().emit(record)
        if self.failing and not self._failed:
            self.failing = False

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)
            return
        self._failed = True
        if not self.failing:
            self.failing = True
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(
                    f"gridd: cannot write {self.baseFilename} ({exc.strerror});"
                    " logging to stderr only until it can\n"
                )


def setup_logging(ws: Workspace, settings: Settings) -> None:
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(fmt)
    root.addHandler(stderr)
    rotating = LogFile(
        ws.log_path,
        max_bytes=settings.daemon.log_max_bytes,
        backups=settings.daemon.log_backups,
    )
    rotating.setFormatter(fmt)
    root.addHandler(rotating)
    root.setLevel(settings.daemon.log_level)


# -- serving ------------------------------------------------------------------------------------


class _Server(Server):
    """uvicorn, with our own signal handling (flags only) and a hook once it accepts."""

    def __init__(
        self,
        config: Config,
        *,
        on_started: Callable[[], None],
        on_signal: Callable[[int], None],
        handle_signals: bool = True,
    ) -> None:
        super().__init__(config)
        self._on_started = on_started
        self._handle_signals = handle_signals
        self.on_signal = on_signal

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_started()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn re-raises a captured SIGTERM after serving, which would turn a graceful
        # stop into exit status 143. We only set flags, and exit 0 like any clean stop.
        if not self._handle_signals:
            yield
            return
        loop = asyncio.get_running_loop()
        sigs = (signal.SIGTERM, signal.SIGINT)
        for sig in sigs:
            loop.add_signal_handler(sig, self._handle_signal, sig)
        try:
            yield
        finally:
            for sig in sigs:
                loop.remove_signal_handler(sig)

    def _handle_signal(self, sig: int) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
            return
        log.info("received %s; shutting down", signal.Signals(sig).name)
        try:
            self.on_signal(sig)
        except Exception:  # a signal handler never raises: the stop goes ahead regardless
            log.exception("winding down before the stop failed; stopping all the same")
        self.should_exit = True


def _write_pid_file(path: Path) -> None:
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(f"{os.getpid()}\n")
    os.replace(tmp, path)


def build_server(
    grid: Grid, *, on_started: Callable[[], None] = lambda: None, handle_signals: bool = True
) -> _Server:
    """The uvicorn server for ``grid``: peer-checked, JSON errors even for unparseable
    requests, no websockets, and a bounded graceful shutdown. Serve it on our own socket."""
    daemon = grid.settings.daemon
    protocol = gridd_protocol(
        allowed_uid=os.getuid(),
        stall_timeout=grid.settings.events.send_timeout_seconds,
        header_timeout=daemon.header_timeout_seconds,
        gate=ConnectionGate(daemon.max_connections),
        shim=str(SHIM_PATH),  # its sandboxed agents may not call the API
    )
    config = Config(
        create_app(grid),
        http=protocol,
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
        # A float is fine at runtime (it goes to asyncio.wait_for); int() would turn 0.5
        # into 0, which uvicorn reads as "cancel every open request at once".
        timeout_graceful_shutdown=grid.settings.daemon.shutdown_timeout_seconds,  # type: ignore[arg-type]
        timeout_keep_alive=30,
    )
    server = _Server(
        config,
        on_started=on_started,
        on_signal=lambda sig: grid.request_shutdown(),
        handle_signals=handle_signals,
    )

    def stop_serving() -> None:
        server.should_exit = True

    grid.on_shutdown_request(stop_serving)
    return server


async def serve(
    ws: Workspace,
    settings: Settings,
    store: Store,
    sock: socket.socket,
    *,
    environ: Mapping[str, str],
    merge_pause: PauseSeam | None = None,
) -> None:
    grid = compose(
        workspace=ws, settings=settings, store=store, environ=environ, merge_pause=merge_pause
    )

    def started() -> None:
        _write_pid_file(ws.pid_path)
        lean.freeze_after_start()
        log.info(
            "gridd %s ready on %s (pid %d)", grid.version().version, ws.socket_path, os.getpid()
        )

    server = build_server(grid, on_started=started)
    await grid.start()
    try:
        await server.serve(sockets=[sock])
    finally:
        await grid.stop()


def use_pidfd_child_watcher() -> bool:
    """Wait for git and other asyncio children with a pidfd on the event loop (Linux 5.3+),
    as Python 3.12 does by itself. 3.11's default watcher starts a thread per child to
    block in ``waitpid``: with the radar, merges and finishes that was a tenth of a busy
    daemon's CPU. Returns whether it is in use."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # an old kernel, or a sandbox without the syscall
        return False
    asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    return True


def check_startup_config(ws: Workspace) -> Settings:
    """The settings a start runs with: ``config.toml`` valid, its commands trusted, its
    agents' adapters known. ``gridd --check-config`` runs this alone, so that ``gridctl
    daemon restart`` and ``upgrade`` refuse a bad config before they stop anything."""
    settings = load_settings(ws.config_path)
    trust.require(ws.root, ws.config_path, os.environ)
    check_profiles(settings, source=str(ws.config_path))
    return settings


def run(workspace: Path | None = None) -> int:
    """Run the daemon in the foreground until it is told to stop. Returns the exit status."""
    try:
        ws = find_workspace(workspace)
        ws.check_socket_path()
        ws.ensure_grid_dir()
        lock_fd = acquire_lock(ws)
    except GriddError as exc:
        print(f"gridd: {exc.message}", file=sys.stderr)
        return 1
    refused = diskfault.refusal(ws.grid_dir)
    if refused is not None:  # before the log file: nothing to write anything into
        print(f"gridd: {refused}", file=sys.stderr)
        os.close(lock_fd)
        return 1
    sock_inode: int | None = None
    store: Store | None = None
    logging_ready = False
    try:
        settings = check_startup_config(ws)
        setup_logging(ws, settings)
        logging_ready = True
        store = Store.open(ws.db_path)
        sock = bind_socket(ws.socket_path)
        sock_inode = os.stat(ws.socket_path).st_ino
        use_pidfd_child_watcher()
        # The one read of the environment: handed down to whatever passes it on (agents'
        # environment, notification commands' PATH, the executors).
        environ = os.environ
        pause = environ.get("GRIDD_TEST_MERGE_PAUSE")  # a test seam: see git/merge.py
        merge_pause = PauseSeam(Path(pause)) if pause else None
        asyncio.run(serve(ws, settings, store, sock, environ=environ, merge_pause=merge_pause))
        return 0
    except GriddError as exc:
        if logging_ready:
            log.error("%s", exc.message)
        else:
            print(f"gridd: {exc.message}", file=sys.stderr)
        return 1
    except Exception as exc:
        if diskfault.refused(exc) is not None:  # a full or read-only disk: one line, no trace
            message = f"stopped: {type(exc).__name__}: {exc}"
            if logging_ready:
                log.error("%s", message)
            else:
                print(f"gridd: {message}", file=sys.stderr)
            return 1
        if not logging_ready:
            raise
        log.exception("gridd stopped by an unexpected error")  # into gridd.log, not just stderr
        return 1
    finally:
        _remove_if_ours(ws.pid_path, lambda p: read_pid_file(p) == os.getpid())
        if sock_inode is not None:
            _remove_if_ours(ws.socket_path, lambda p: p.stat().st_ino == sock_inode)
        if store is not None:
            store.close()
        os.close(lock_fd)


def _remove_if_ours(path: Path, ours: Callable[[Path], bool]) -> None:
    try:
        if ours(path):
            path.unlink()
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("could not remove %s: %s", path, exc)
