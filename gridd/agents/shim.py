"""The per-agent supervisor ("shim"): a tiny stdlib-only process that outlives the daemon.

    python -I -S shim.py RUN_DIR

It reads ``RUN_DIR/spec.json``, starts the agent in its own session with stdout and stderr
appended to ``RUN_DIR/output.log`` (a file: the agent can never block on a full pipe, and
nothing is lost while the daemon is away), stdin from the FIFO ``RUN_DIR/stdin`` (held open
read-write here, so the agent never sees a spurious EOF), writes ``agent.json`` with the
agent's pid once it runs, and ``exit.json`` with its real exit status when it ends.

The daemon signals the agent's process group directly; the shim only forwards the signals
it receives itself. It must stay small: no imports beyond the standard library.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

STDIN_PIPE_BYTES = 1024 * 1024


def _write_json(path: str, data: dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
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
    for sig, pause in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 0.0)):
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


def main(run_dir: str) -> int:
    with open(os.path.join(run_dir, "spec.json")) as fh:
        spec = json.load(fh)
    out = os.open(
        os.path.join(run_dir, "output.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
    )
    if spec.get("stdin", "pipe") == "pipe":
        fifo = os.path.join(run_dir, "stdin")
        if not os.path.exists(fifo):
            os.mkfifo(fifo, 0o600)
        stdin = os.open(fifo, os.O_RDWR)
        _grow_pipe(stdin)
    else:
        stdin = os.open(os.devnull, os.O_RDONLY)
    try:
        proc = subprocess.Popen(
            spec["argv"],
            cwd=spec["cwd"],
            env=spec["env"],
            stdin=stdin,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        os.write(out, f"gridd: cannot start agent: {exc}\n".encode())
        _write_json(
            os.path.join(run_dir, "exit.json"),
            {"exitCode": 127, "signal": None, "error": str(exc), "endedAt": time.time()},
        )
        return 0
    os.close(out)
    os.close(stdin)
    _write_json(
        os.path.join(run_dir, "agent.json"),
        {"pid": proc.pid, "shimPid": os.getpid(), "startedAt": time.time()},
    )

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(proc.pid, signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = proc.wait()
    _reap_group(proc.pid)
    _write_json(
        os.path.join(run_dir, "exit.json"),
        {
            "exitCode": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "endedAt": time.time(),
        },
    )
    return 0


if __name__ == "__main__":
    if "--detach" in sys.argv[2:] and os.fork() > 0:
        os._exit(0)  # the launcher returns at once; the shim lives on, owned by init
    sys.exit(main(sys.argv[1]))
