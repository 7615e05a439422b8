"""The per-agent supervisor ("shim"): a tiny stdlib-only process that outlives the daemon.

    python -I -S shim.py RUN_DIR [--detach]

It first claims the run (``RUN_DIR/claim``, created exclusively: a restarted daemon may have
fenced it, and then it starts nothing), reads ``RUN_DIR/spec.marshal`` (argv, cwd, env, stdin mode), starts the agent in its own
session with stdout and stderr appended to ``RUN_DIR/output.log`` (a file: the agent can
never block on a full pipe, and nothing is lost while the daemon is away), stdin from the
FIFO ``RUN_DIR/stdin`` (held open read-write here, so the agent never sees a spurious EOF),
writes ``agent.json`` with the agent's pid once it runs, and ``exit.json`` with its real exit
status when it ends. SIGUSR1 closes the agent's stdin: the shim lets go of its writer.

The daemon signals the agent's process group directly; the shim only forwards the signals
it receives itself. On Linux the shim is the agent's child subreaper
(``PR_SET_CHILD_SUBREAPER``): whatever the agent starts stays below the shim, even after a
``setsid()`` or ``setpgid()`` or the death of its parent, and when the agent ends (it exits,
or is stopped, killed or timed out) the shim ends every process still below it (SIGTERM
with SIGCONT, SIGKILL a second later) before it writes ``exit.json``. That needs no daemon:
it holds while the daemon is away or restarting. A run whose workspace's ``.grid/`` is
deleted or replaced (the spec names it; its device and inode are noted at the start) can
never be reattached: ``WorkspaceWatch`` stops its agent after the spec's ``orphan_grace``.

It starts on every spawn, so it imports only modules built into the interpreter
(``marshal``, ``_signal``, no ``json`` or ``subprocess``; ``ctypes``, for ``prctl``, is
imported ahead of need): that is the difference between ~8 ms and ~20 ms of start-up.

A run whose sandbox has no network (``none``, ``allowlist``) is watched by a thread of the
shim too: the seccomp listener's supervisor (``runs/refusals.py``), which answers the
agent's refused sockets, connections and listeners and records them in ``denied.ndjson``
(``agent.sandbox_denied``). It starts once the daemon heard the agent start.
"""

from __future__ import annotations

import _signal
import errno
import fcntl
import marshal
import os
import sys
import time

STDIN_PIPE_BYTES = 1024 * 1024
#: Created exclusively by whoever takes the run first: this shim (it starts the agent) or a
#: daemon fencing a spawn that never started: one it gave up on, or one a restarted daemon
#: found recorded but not started (``process.fence_run``).
CLAIM = "claim"


def _json_str(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _json_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return _json_str(value)
    return repr(value)  # ints and floats


def _write_json(path: str, data: dict[str, object], *, durable: bool) -> None:
    body = "{" + ", ".join(f"{_json_str(k)}: {_json_value(v)}" for k, v in data.items()) + "}"
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, body.encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


#: A disk that refuses writes (full, read-only): the shim waits for it, it never gives up.
_DISK_REFUSALS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def _write_exit(run_dir: str, data: dict[str, object]) -> None:
    """Write ``exit.json``, waiting out a disk that refuses it: a shim that died of a full
    or read-only disk would leave the run's end unknown (the daemon could only call it a
    dead supervisor), when all it takes is to say it once the disk takes writes again."""
    pause = 0.2
    while True:
        try:
            _write_json(os.path.join(run_dir, "exit.json"), data, durable=True)
            return
        except OSError as exc:
            if exc.errno not in _DISK_REFUSALS:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 5.0)


def _grow_pipe(fd: int) -> None:
    """Room for a whole answer (a permission reply echoes the tool's input) in one write."""
    size_op = getattr(fcntl, "F_SETPIPE_SZ", None)
    if size_op is not None:
        try:
            fcntl.fcntl(fd, size_op, STDIN_PIPE_BYTES)
        except OSError:
            pass  # capped by /proc/sys/fs/pipe-max-size: the default buffer still works


#: ``prctl`` option (Linux ``<linux/prctl.h>``): orphans below us are re-parented to us.
PR_SET_CHILD_SUBREAPER = 36
#: What the agent leaves running gets SIGTERM, then SIGKILL after this long.
LEFTOVER_GRACE_SECONDS = 1.0
#: A run whose workspace is gone: SIGTERM, then SIGKILL after this long.
ORPHAN_KILL_SECONDS = 5.0
#: SIGKILL given, how long we keep looking for what is still there (a process in
#: uninterruptible sleep dies only when its I/O returns): then the shim writes its exit.
KILL_WAIT_SECONDS = 5.0


def _become_subreaper() -> bool:
    """Make the shim the child subreaper of its agent (Linux): a descendant that loses its
    parent (a daemon that double-forks, a ``setsid`` child of an agent that exited) is
    re-parented to us, not to init, so it stays below us and dies with the run whatever
    session or process group it moved to. False where the OS has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes  # imported ahead of need (``_serve``, a spare shim), so this is cheap

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _preload() -> None:
    """Import ``ctypes`` (for ``_become_subreaper``), ``landlock`` with what it calls the
    kernel with (``landlock.prepare``), ``landlock_rules``, ``seccomp`` and ``refusals``
    (for a sandboxed run) ahead of need:
    a shim server before it forks any shim, a spare shim while it waits for its run. A
    first import of a module off the standard library's path costs ~1-2 ms (each path
    entry's directory is listed), on the spawn's clock when done after the fork."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # noqa: F401

            _sandboxing("landlock").prepare()
            _sandboxing("landlock_rules")
            _sandboxing("seccomp")
            _sandboxing("refusals")
            import _socket  # noqa: F401  (the listener's way from the child: ``_spawn``)
            import _thread  # noqa: F401  (and its supervisor's: ``_supervise``)
            import select  # noqa: F401
        except ImportError:
            pass


def _read_small(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _children_by_parent() -> dict[int, list[int]]:
    """Every live process's children, from each ``/proc/<pid>/stat``: where the kernel keeps
    no ``/proc/<pid>/task/<tid>/children``. Zombies are left out: they hold nothing."""
    tree: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return tree
    for name in names:
        if not name.isdigit():
            continue
        try:
            fields = _read_small(f"/proc/{name}/stat").rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[0] != b"Z":
            tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def _children(pid: int) -> list[int]:
    """``pid``'s children, from ``/proc/<pid>/task/*/children`` (one list per thread)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone meanwhile
    found: list[int] = []
    for tid in tids:
        try:
            found += [int(c) for c in _read_small(f"/proc/{pid}/task/{tid}/children").split()]
        except (OSError, ValueError):
            continue  # that thread ended meanwhile
    return found


def descendants(root: int) -> list[int]:
    """Every process below ``root``, parents before their children (Linux ``/proc``; empty
    elsewhere). One forked while we look is found by the next look."""
    if not os.path.isdir("/proc/self/task"):
        return []
    listed = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
    tree = None if listed else _children_by_parent()
    found: list[int] = []
    seen = {root}
    todo = [root]
    while todo:
        parent = todo.pop()
        for child in _children(parent) if tree is None else tree.get(parent, []):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def _reap_children() -> None:
    """Collect every child of ours that has exited (re-parented orphans included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _send(pids: list[int], sig: int) -> None:
    for target in pids:
        try:
            os.kill(target, sig)
        except OSError:
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    return True


def end_leftovers(group: int | None, *, grace: float = LEFTOVER_GRACE_SECONDS) -> None:
    """End what the agent left running: every process below the shim (as the child
    subreaper, a descendant stays below us whatever ``setsid()`` or ``setpgid()`` it
    called), and the agent's process ``group`` where we are no subreaper (then it is all
    we can reach; as one, its members are all below us, and a group id whose leader is
    reaped may already be another process's). SIGTERM with SIGCONT (a stopped process
    cannot act on TERM), SIGKILL after ``grace``; each reaped as it goes."""
    me = os.getpid()
    start = time.monotonic()
    phases = ((_signal.SIGTERM, _signal.SIGCONT), (_signal.SIGKILL,))
    phase = -1
    signalled: set[int] = set()
    while True:
        _reap_children()
        left = descendants(me)
        if not left and (group is None or not _group_alive(group)):
            return
        elapsed = time.monotonic() - start
        if elapsed > grace + KILL_WAIT_SECONDS:
            return  # unkillable for now (uninterruptible I/O): the run ends all the same
        wanted = 0 if elapsed < grace else 1
        if wanted != phase:
            phase = wanted
            signalled.clear()
            for sig in phases[phase]:
                try:
                    if group is not None:
                        os.killpg(group, sig)
                except OSError:
                    pass
        fresh = [p for p in left if p not in signalled]
        for sig in phases[phase]:
            _send(fresh, sig)
        signalled.update(fresh)
        time.sleep(0.02)


class ExecFailed(OSError):
    """The agent's command could not be started; ``str()`` is the reason, for a person."""

    def __str__(self) -> str:
        return str(self.strerror)


def exec_failure(command: str, exc: OSError, *, search_path: str) -> str:
    """Why ``command`` (the profile's first word, as the user wrote it) could not be run,
    from the working directory, with ``search_path`` as PATH. ``execvpe``'s own error names
    the last PATH entry it tried, a file the user never named."""
    searched = os.sep not in command
    if searched:
        places = (os.path.join(d or ".", command) for d in search_path.split(os.pathsep))
        found = next((p for p in places if os.path.isfile(p)), None)
    else:
        found = command if os.path.isfile(command) else None
    shown = f"{command!r} ({found})" if searched and found else repr(command)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        if found is not None:  # the kernel could not find the '#!' line's interpreter
            return f"{shown} names an interpreter in its '#!' line that does not exist"
        return f"{shown} not found on PATH" if searched else f"{shown} does not exist"
    if exc.errno == errno.EACCES:
        return f"{shown} is not executable"
    if exc.errno == errno.ENOEXEC:
        return f"{shown} is not a program this system can run (a script needs a '#!' line)"
    return f"{shown}: {exc.strerror}"


def _sandboxing(name: str):  # type: ignore[no-untyped-def]  # (no typing import at start-up)
    """A sandbox module beside us (``landlock.py`` and ``landlock_rules.py`` on Linux,
    ``seatbelt.py`` on macOS;
    stdlib-only like the shim), loaded for a sandboxed run (``landlock`` ahead of need,
    by ``_preload``): as ``gridd.runs.<name>``
    when we are imported, from our own directory when we run as a script (``-I -S``:
    nothing of gridd's is on the path)."""
    if __package__:
        return __import__(f"gridd.runs.{name}", fromlist=[name])
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.append(here)
    return __import__(name)


def _loaded(name: str):  # type: ignore[no-untyped-def]
    """The sandbox module ``name`` if this process loaded it (``_preload``), else None."""
    return sys.modules.get(f"gridd.runs.{name}" if __package__ else name)


def _take_spare(sandbox: object):  # type: ignore[no-untyped-def]
    """The spare ruleset the shim server made for a run with this ``sandbox`` (inherited
    through the fork; ``landlock_rules.Spare``), if any: the others are closed here."""
    rules = _loaded("landlock_rules")
    if rules is None:
        return None
    return rules.take_spare(sandbox if isinstance(sandbox, dict) else {})


def _spare_taken(run_dir: str) -> None:
    """In the shim server, once it forked a run's shim: which spare ruleset that shim took
    (its copy here is closed), so that another is made for the next run of its kind."""
    rules = _loaded("landlock_rules")
    if rules is None:
        return
    try:
        with open(os.path.join(run_dir, "spec.marshal"), "rb") as fh:
            sandbox = marshal.load(fh).get("sandbox")
    except (OSError, ValueError, EOFError, TypeError, AttributeError):
        return
    if isinstance(sandbox, dict):
        rules.spare_taken(sandbox)


def _spawn(spec: dict[str, object], stdin: int, out: int) -> int:
    """fork + exec in a new session; an exec failure comes back as ``ExecFailed``. A run
    with a ``sandbox`` is bound to it in the child, just before ``exec``: a kernel that
    cannot enforce it fails the start (``landlock.SandboxUnavailable``), never unconfined.
    On macOS the agent is executed through ``sandbox-exec`` with the sandbox's profile
    (``seatbelt.command``), which applies it at that ``exec``. A run without the network
    gets the seccomp filter too (after Landlock), with a listener: the child sends it to
    us (``_listener``) and closes its own before ``exec`` (``runs/refusals.py``)."""
    argv = [str(a) for a in spec["argv"]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in spec["env"].items()}  # type: ignore[attr-defined]
    sandbox = spec.get("sandbox")
    rules = seccomp = None
    spare = _take_spare(sandbox)
    if sandbox and sys.platform == "darwin":
        argv = _sandboxing("seatbelt").command(sandbox, argv)
    elif sandbox:
        rules = _sandboxing("landlock_rules")
        if sandbox.get("network", "allow") != "allow":  # type: ignore[attr-defined]
            seccomp = _sandboxing("seccomp")  # UDP, raw sockets, io_uring: not Landlock's
    err_r, err_w = os.pipe()
    os.set_inheritable(err_w, False)
    fcntl.fcntl(err_w, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
    pair = None
    if seccomp is not None:
        import _socket  # preloaded; not ``socket``, whose import costs milliseconds

        pair = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)  # close-on-exec
    pid = os.fork()
    if pid == 0:  # the child: become the agent
        try:
            os.setsid()
            os.chdir(str(spec["cwd"]))
            os.dup2(stdin, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            kept = {err_w, spare.ruleset.fd if spare is not None else err_w}
            if pair is not None:
                pair[0].close()
                kept.add(pair[1].fileno())
            for low, high in zip([2, *sorted(kept)], [*sorted(kept), 1 << 16], strict=True):
                os.closerange(low + 1, high)
            if rules is not None:
                rules.enforce(sandbox, spare)
            if pair is not None:
                listener: list[int] = []
                if (why := seccomp.close_datagrams(listener)) is not None:  # type: ignore[union-attr]
                    raise _sandboxing("landlock").SandboxUnavailable(errno.ENOSYS, why)
                rights = listener[0].to_bytes(4, sys.byteorder)
                pair[1].sendmsg([b"L"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
                os.close(listener[0])  # the agent never holds it
            try:
                os.execvpe(argv[0], argv, env)
            except OSError as exc:
                message = exec_failure(argv[0], exc, search_path=env.get("PATH", os.defpath))
                raise ExecFailed(exc.errno, message) from None
        except OSError as exc:
            os.write(err_w, f"{exc.errno}:{exc}".encode())
        finally:
            os._exit(127)
    os.close(err_w)
    if pair is not None:
        pair[1].close()
    if spare is not None:
        spare.close()  # the child's now
    failure = b""
    while chunk := os.read(err_r, 4096):
        failure += chunk
    os.close(err_r)
    if pair is not None:
        _take_listener(pair[0], failure)
    if failure:
        os.waitpid(pid, 0)
        errno_text, _, message = failure.decode(errors="replace").partition(":")
        raise ExecFailed(int(errno_text) if errno_text.isdigit() else 0, message)
    return pid


def _take_listener(ours: object, failure: bytes) -> None:
    """The seccomp listener the child sent (``_spawn``), into ``_listener``; closed at once
    when the start failed."""
    import _socket

    try:
        _msg, ancillary, _flags, _addr = ours.recvmsg(1, _socket.CMSG_SPACE(4))  # type: ignore[attr-defined]
    finally:
        ours.close()  # type: ignore[attr-defined]
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS and len(data) >= 4:
            fd = int.from_bytes(data[:4], sys.byteorder)
            if failure:
                os.close(fd)
            else:
                _listener.append(fd)


_ready: list[int] = []  # our end of the daemon's "it is running" pipe, until released
_listener: list[int] = []  # the agent's seccomp listener (``_spawn``), for ``refusals``
_holder: list[int] = []  # our writer on the agent's stdin FIFO, until the daemon closes it


class WorkspaceWatch:
    """Ends a run whose workspace is gone: its ``.grid/`` deleted, or replaced by another
    (a different device or inode than at the start). No daemon can ever reattach such a
    run, so, ``grace`` seconds after it went (and unless it came back), the agent's group
    gets SIGTERM with SIGCONT, and SIGKILL ``ORPHAN_KILL_SECONDS`` later; the shim then
    ends what is left as for any run, and exits. Looked at on SIGALRM (an interval timer:
    no thread, and the shim's wait for the agent goes on between looks)."""

    def __init__(self, grid: str, grace: float) -> None:
        st = os.stat(grid)
        self.grid = grid
        self.identity = (st.st_dev, st.st_ino)
        self.grace = grace
        self.agent = 0
        self.gone_since: float | None = None
        self.termed_at: float | None = None

    def start(self, agent: int) -> None:
        self.agent = agent
        every = min(5.0, max(0.1, self.grace / 4))
        _signal.signal(_signal.SIGALRM, self._look)
        _signal.setitimer(_signal.ITIMER_REAL, every, every)

    def stop(self) -> None:
        _signal.setitimer(_signal.ITIMER_REAL, 0, 0)

    def present(self) -> bool:
        """False when ``.grid/`` is gone or another directory; an error that says neither
        (EIO, EACCES: a disk or a mount in trouble) is no evidence that it went."""
        try:
            st = os.stat(self.grid)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError:
            return True
        return (st.st_dev, st.st_ino) == self.identity

    def _look(self, _signum: int, _frame: object) -> None:
        now = time.monotonic()
        if self.termed_at is not None:
            if now - self.termed_at >= ORPHAN_KILL_SECONDS:
                self._signal(_signal.SIGKILL)
            return
        if self.present():
            self.gone_since = None
            return
        if self.gone_since is None:
            self.gone_since = now
            _say(f"{self.grid} is gone or replaced; stopping the agent in {self.grace:g}s")
        if now - self.gone_since >= self.grace:
            _say(f"{self.grid} is still gone: stopping the agent (no daemon can reattach it)")
            self.termed_at = now
            self._signal(_signal.SIGTERM)
            self._signal(_signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.agent, sig)
        except OSError:
            pass


def _say(line: str) -> None:
    """A line in the run's ``shim.log`` (our stderr)."""
    try:
        os.write(2, f"gridd shim {os.getpid()}: {line}\n".encode())
    except OSError:
        pass


def _close_stdin(_signum: int, _frame: object) -> None:
    """SIGUSR1: let go of our writer on the agent's stdin, so the agent reads EOF once the
    daemon's pending writes are read (the end of a stream-json conversation)."""
    while _holder:
        try:
            os.close(_holder.pop())
        except OSError:
            pass


def main(run_dir: str, ready_fd: int | None = None) -> int:
    if ready_fd is not None:
        _ready.append(ready_fd)
    try:
        return _run(run_dir)
    finally:
        _release()


def _release() -> None:
    """Tell the daemon (by closing our end of its pipe) that agent.json or exit.json is in.
    Once only: a second close could hit an unrelated file that reused the number."""
    while _ready:
        try:
            os.close(_ready.pop())
        except OSError:
            pass


def _claim(run_dir: str) -> bool:
    """Take the run (``claim``, created exclusively), or learn that a restarted daemon fenced
    it first: it found the run not started, and starts the task afresh in a new run."""
    try:
        fd = os.open(os.path.join(run_dir, CLAIM), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    try:
        os.write(fd, f"shim {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return True


def _run(run_dir: str) -> int:
    if not _claim(run_dir):
        # Fenced: the daemon gave up on this spawn (or a restarted one found it not
        # started) and may have started the task again in a new run. Never a second one.
        try:
            with open(os.path.join(run_dir, CLAIM), "rb") as fh:
                why = fh.read(500).decode(errors="replace").strip()
        except OSError:
            why = "claim taken"
        _say(f"not starting the agent: {why}")
        return 0
    with open(os.path.join(run_dir, "spec.marshal"), "rb") as fh:
        spec = marshal.load(fh)
    out = os.open(
        os.path.join(run_dir, "output.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
    )
    if spec.get("stdin", "pipe") == "pipe":
        fifo = os.path.join(run_dir, "stdin")
        if not os.path.exists(fifo):
            os.mkfifo(fifo, 0o600)
        # We hold a writer (so the agent never sees EOF while the daemon is away) and give
        # the agent a read-only end: once we let go of ours (SIGUSR1: the daemon closes the
        # agent's stdin), the agent reads EOF.
        _holder.append(os.open(fifo, os.O_RDWR))
        _grow_pipe(_holder[0])
        stdin = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(stdin, True)
        _signal.signal(_signal.SIGUSR1, _close_stdin)
    else:
        stdin = os.open(os.devnull, os.O_RDONLY)
    watch = None
    if spec.get("grid"):
        try:
            watch = WorkspaceWatch(str(spec["grid"]), float(spec.get("orphan_grace", 60.0)))
        except OSError:
            pass  # already gone: the daemon that wrote the spec is too; nothing to compare
    contained = _become_subreaper()
    try:
        pid = _spawn(spec, stdin, out)
    except OSError as exc:
        os.write(out, f"gridd: cannot start agent: {exc}\n".encode())
        _write_exit(
            run_dir,
            {"exitCode": 127, "signal": None, "error": str(exc), "endedAt": time.time()},
        )
        return 0
    os.close(out)
    os.close(stdin)
    _write_json(
        os.path.join(run_dir, "agent.json"),
        {"pid": pid, "shimPid": os.getpid(), "startedAt": time.time()},
        durable=False,  # if the machine goes down, the agent goes with it
    )
    _release()
    supervisor = _supervise(run_dir, spec)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, forward)
    if watch is not None:
        watch.start(pid)
    status = _wait_for(pid)
    if watch is not None:
        watch.stop()
    code = os.waitstatus_to_exitcode(status)
    end_leftovers(
        None if contained else pid
    )  # before exit.json: nothing of the run writes after it says it ended
    if supervisor is not None:
        supervisor.flush(final=True)  # what was held back is said before the end
    try:
        _write_exit(
            run_dir,
            {
                "exitCode": code if code >= 0 else None,
                "signal": -code if code < 0 else None,
                "endedAt": time.time(),
            },
        )
    except OSError:
        if watch is None or watch.present():
            raise
        # The run directory went with the workspace: no one is left to read it.
    return 0


def _supervise(run_dir: str, spec: dict[str, object]):  # type: ignore[no-untyped-def]
    """Answer the agent's seccomp listener in a thread (``refusals.Supervisor``), once
    the daemon heard the agent start: off the spawn's clock. None without a listener."""
    if not _listener:
        return None
    import _thread

    refusals = _sandboxing("refusals")
    sandbox = spec.get("sandbox")
    ports = _sandboxing("landlock_rules").connect_ports(
        sandbox if isinstance(sandbox, dict) else {}
    )
    supervisor = refusals.Supervisor(
        _listener.pop(), os.path.join(run_dir, refusals.DENIED_FILE), ports
    )
    _thread.start_new_thread(supervisor.serve, ())
    return supervisor


def _wait_for(agent: int) -> int:
    """The agent's wait status. Orphans re-parented to us meanwhile are collected as they
    exit, so none stays a zombie while the agent runs."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == agent:
            return status


def _await_run_dir(go_fd: int) -> str:
    """A shim started ahead of need: wait for the daemon to name the run directory, then
    log there. Nothing but EOF (the daemon is gone, or shut down) means: not needed."""
    data = b""
    while chunk := os.read(go_fd, 4096):
        data += chunk
    os.close(go_fd)
    run_dir = data.decode(errors="replace").strip()
    if run_dir:
        log = os.open(
            os.path.join(run_dir, "shim.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
        )
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    return run_dir


def _serve(control_fd: int) -> int:
    """The shim server: started once per daemon, it forks a shim for each run directory the
    daemon sends (with the run's ready pipe). A fork costs well under a millisecond where a
    new interpreter costs ~8 ms of CPU. It exits when the daemon closes its end."""
    import socket  # once per daemon, not per agent

    _preload()
    rules = _loaded("landlock_rules")
    control = socket.socket(fileno=control_fd)
    while True:
        # Spare rulesets (``landlock_rules.Spare``) are made when no run is arriving, and
        # dropped once too old to serve.
        control.settimeout(rules.spares_due() if rules is not None else None)
        try:
            msg, fds, _flags, _addr = socket.recv_fds(control, 4096, 4)
        except TimeoutError:
            rules.tend_spares()
            continue
        except InterruptedError:
            continue
        except OSError:
            return 0
        if not msg:
            return 0  # the daemon is gone: shims already forked live on
        ready = fds[0] if fds else None
        for extra in fds[1:]:
            os.close(extra)
        pid = os.fork()
        if pid == 0:
            control.close()
            if os.fork() > 0:
                os._exit(0)  # detach: the shim is owned by init, like a launched one
            os.setsid()
            run_dir = msg.decode(errors="replace").strip()
            log = os.open(
                os.path.join(run_dir, "shim.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
            )
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            code = 1
            try:
                code = main(run_dir, ready)
            finally:
                os._exit(code)
        if ready is not None:
            os.close(ready)
        os.waitpid(pid, 0)
        _spare_taken(msg.decode(errors="replace").strip())


def _fd_option(options: list[str], name: str) -> int | None:
    prefix = f"--{name}="
    return next((int(o[len(prefix) :]) for o in options if o.startswith(prefix)), None)


if __name__ == "__main__":
    options = sys.argv[2:]
    ready = _fd_option(options, "ready-fd")
    go = _fd_option(options, "go-fd")
    control = _fd_option(options, "control-fd")
    if "--detach" in options and os.fork() > 0:
        os._exit(0)  # the launcher returns at once; the shim lives on, owned by init
    if control is not None:
        sys.exit(_serve(control))
    if go is not None:
        _preload()  # while we wait for the run: not after, on the spawn's clock
    target = _await_run_dir(go) if go is not None else sys.argv[1]
    if not target:
        sys.exit(0)
    sys.exit(main(target, ready))
