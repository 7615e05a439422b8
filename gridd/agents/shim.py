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
it receives itself. It starts on every spawn, so it imports only modules built into the
interpreter (``marshal``, ``_signal``, no ``json`` or ``subprocess``): that is the difference
between ~8 ms and ~20 ms of start-up.
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
#: restarted daemon fencing a spawn that never started (``LocalExecutor.fence``).
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


def _grow_pipe(fd: int) -> None:
    """Room for a whole answer (a permission reply echoes the tool's input) in one write."""
    size_op = getattr(fcntl, "F_SETPIPE_SZ", None)
    if size_op is not None:
        try:
            fcntl.fcntl(fd, size_op, STDIN_PIPE_BYTES)
        except OSError:
            pass  # capped by /proc/sys/fs/pipe-max-size: the default buffer still works


def _reap_group(pgid: int) -> None:
    """End what the agent left running in its process group (TERM, then KILL)."""
    for sig, pause in ((_signal.SIGTERM, 1.0), (_signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + pause
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
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


def _spawn(spec: dict[str, object], stdin: int, out: int) -> int:
    """fork + exec in a new session; an exec failure comes back as ``ExecFailed``."""
    argv = [str(a) for a in spec["argv"]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in spec["env"].items()}  # type: ignore[attr-defined]
    err_r, err_w = os.pipe()
    os.set_inheritable(err_w, False)
    fcntl.fcntl(err_w, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child: become the agent
        try:
            os.setsid()
            os.chdir(str(spec["cwd"]))
            os.dup2(stdin, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.closerange(3, err_w)
            os.closerange(err_w + 1, 1 << 16)
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
    failure = b""
    while chunk := os.read(err_r, 4096):
        failure += chunk
    os.close(err_r)
    if failure:
        os.waitpid(pid, 0)
        errno_text, _, message = failure.decode(errors="replace").partition(":")
        raise ExecFailed(int(errno_text) if errno_text.isdigit() else 0, message)
    return pid


_ready: list[int] = []  # our end of the daemon's "it is running" pipe, until released
_holder: list[int] = []  # our writer on the agent's stdin FIFO, until the daemon closes it


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
    try:
        pid = _spawn(spec, stdin, out)
    except OSError as exc:
        os.write(out, f"gridd: cannot start agent: {exc}\n".encode())
        _write_json(
            os.path.join(run_dir, "exit.json"),
            {"exitCode": 127, "signal": None, "error": str(exc), "endedAt": time.time()},
            durable=True,
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

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, forward)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    _reap_group(pid)
    _write_json(
        os.path.join(run_dir, "exit.json"),
        {
            "exitCode": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "endedAt": time.time(),
        },
        durable=True,
    )
    return 0


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

    control = socket.socket(fileno=control_fd)
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(control, 4096, 4)
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
    target = _await_run_dir(go) if go is not None else sys.argv[1]
    if not target:
        sys.exit(0)
    sys.exit(main(target, ready))
