"""The daemon process: one per workspace, its socket and files, refusals, and clean stops.

Every test here runs real ``gridd`` processes on real git repositories under /tmp.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd import daemon as daemon_module
from gridd import lockholder
from gridd.errors import AlreadyRunning, WorkspaceError
from gridd.store import MIGRATIONS, SCHEMA_VERSION
from gridd.workspace import SOCKET_PATH_MAX, Workspace
from tests.support.api import socket_answers
from tests.support.cli import GRIDD, run_gridd
from tests.support.daemons import DaemonProc, running_daemon, start_daemon
from tests.support.repos import remove_repo, write_config
from tests.support.sse import SSERead, read_sse
from tests.support.waits import wait_for


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _git_init(path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(path)], check=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A short-named empty directory under /tmp (not a git repository)."""
    path = Path(tempfile.mkdtemp(prefix="g", dir="/tmp"))
    yield path
    remove_repo(path)


# -- one daemon per workspace ---------------------------------------------------------------


def test_second_daemon_refuses_and_leaves_the_first_untouched(daemon: DaemonProc) -> None:
    inode = daemon.sock.stat().st_ino

    result = run_gridd(daemon.root)

    assert result.returncode != 0
    expected = f"gridd is already running for {daemon.root.resolve()} (pid {daemon.proc.pid})"
    assert expected in result.stderr
    assert daemon.proc.poll() is None
    assert daemon.sock.stat().st_ino == inode
    assert daemon.client().get("/health")["pid"] == daemon.proc.pid


def test_second_daemon_started_from_a_subdirectory_is_refused_too(daemon: DaemonProc) -> None:
    sub = daemon.root / "deep" / "er"
    sub.mkdir(parents=True)
    result = run_gridd(sub)
    assert result.returncode != 0
    assert "already running" in result.stderr
    assert daemon.client().get("/health")["pid"] == daemon.proc.pid


def test_ten_simultaneous_starts_leave_exactly_one_daemon(repo: Path) -> None:
    outs = [open(repo / f".start-{n}.out", "w+") for n in range(10)]  # noqa: SIM115
    procs = [
        subprocess.Popen([*GRIDD, "--workspace", str(repo)], stdout=out, stderr=subprocess.STDOUT)
        for out in outs
    ]
    try:
        wait_for(
            lambda: sum(p.poll() is not None for p in procs) >= 9,
            timeout=90,
            message="nine of ten gridd processes to give up",
        )
        sock = repo / ".grid" / "gridd.sock"
        wait_for(lambda: socket_answers(sock), timeout=30, message="the survivor to answer")
        survivors = [p for p in procs if p.poll() is None]
        assert len(survivors) == 1
        winner = survivors[0]
        with DaemonProc(root=repo, proc=winner).client() as client:
            assert client.get("/health")["pid"] == winner.pid
        for proc, out in zip(procs, outs, strict=True):
            if proc is winner:
                continue
            assert proc.returncode != 0
            out.seek(0)
            text = out.read()
            assert f"already running for {repo.resolve()} (pid {winner.pid})" in text, text
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for out in outs:
            out.close()


# -- leftovers: stale files are cleaned up, foreign ones never --------------------------------


def test_daemon_starts_over_the_stale_socket_and_pid_file_of_a_killed_one(repo: Path) -> None:
    first = start_daemon(repo)
    first.kill9()
    assert stat.S_ISSOCK(first.sock.lstat().st_mode), "kill -9 should leave the socket behind"
    assert (first.grid_dir / "gridd.pid").read_text().strip() == str(first.proc.pid)

    with running_daemon(repo) as second:
        assert second.client().get("/health")["pid"] == second.proc.pid
        assert (second.grid_dir / "gridd.pid").read_text().strip() == str(second.proc.pid)
        assert "removing stale socket" in second.stderr_text()


def test_file_that_is_not_a_socket_is_refused_and_kept(repo: Path) -> None:
    grid = repo / ".grid"
    grid.mkdir(mode=0o700)
    (grid / "gridd.sock").write_text("precious data\n")

    result = run_gridd(repo)

    assert result.returncode == 1
    assert "gridd.sock exists and is not a socket" in result.stderr
    assert (grid / "gridd.sock").read_text() == "precious data\n"
    assert not (grid / "gridd.pid").exists()


def test_live_socket_of_another_program_is_never_replaced(repo: Path) -> None:
    grid = repo / ".grid"
    grid.mkdir(mode=0o700)
    path = grid / "gridd.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(8)
        inode = path.lstat().st_ino

        result = run_gridd(repo)

        assert result.returncode == 1
        assert "refusing to replace a live socket" in result.stderr
        assert path.lstat().st_ino == inode
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(path))  # still ours
    finally:
        listener.close()


# -- modes ------------------------------------------------------------------------------------


def test_state_dir_is_0700_and_socket_0600_from_the_first_instant(repo: Path) -> None:
    grid = repo / ".grid"
    grid.mkdir(mode=0o755)
    os.chmod(grid, 0o755)  # a looser directory from elsewhere is tightened
    sock = grid / "gridd.sock"
    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                seen.add(_mode(sock))
            except FileNotFoundError:
                pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with running_daemon(repo) as d:
            stop.set()
            watcher.join()
            seen.add(_mode(sock))
            assert _mode(d.grid_dir) == 0o700
            assert stat.S_ISSOCK(sock.lstat().st_mode)
            assert _mode(sock) == 0o600
            assert seen == {0o600}
            assert _mode(d.grid_dir / "gridd.lock") == 0o600
    finally:
        stop.set()


def test_socket_is_created_0600_by_the_umask_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No window where the socket is looser: the mode comes from bind() itself, so even
    with a permissive process umask and the follow-up chmod disabled, it is 0600."""
    path = Path(tempfile.mkdtemp(prefix="s", dir="/tmp")) / "t.sock"
    old = os.umask(0)
    monkeypatch.setattr(os, "chmod", lambda *a, **k: None)
    try:
        sock = daemon_module.bind_socket(path)
        sock.close()
        assert _mode(path) == 0o600
        assert os.umask(0) == 0, "bind_socket must restore the caller's umask"
    finally:
        os.umask(old)
        monkeypatch.undo()
        remove_repo(path.parent)


def test_bind_socket_removes_only_a_socket_nobody_listens_on(tmp_path: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    try:
        path = base / "t.sock"
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(path))
        dead.close()  # a socket file with nobody behind it: connect() is refused
        sock = daemon_module.bind_socket(path)
        with pytest.raises(WorkspaceError) as info:
            daemon_module.bind_socket(path)  # now somebody listens
        assert info.value.code == "socket_in_use"
        sock.close()
    finally:
        remove_repo(base)


# -- where the daemon may run -----------------------------------------------------------------


def _repo_with_socket_path_of(length: int, scratch: Path) -> Path:
    suffix = len("/.grid/gridd.sock")
    name_len = length - suffix - len(str(scratch)) - 1
    root = scratch / ("w" * name_len)
    root.mkdir()
    _git_init(root)
    assert len(os.fsencode(root / ".grid" / "gridd.sock")) == length
    return root


def test_workspace_too_deep_for_a_socket_is_refused_naming_the_limit(scratch: Path) -> None:
    root = _repo_with_socket_path_of(SOCKET_PATH_MAX + 1, scratch)

    result = run_gridd(root)

    assert result.returncode == 1
    assert "too deep for a Unix socket" in result.stderr
    assert f"the limit is {SOCKET_PATH_MAX}" in result.stderr
    assert SOCKET_PATH_MAX == 107
    assert not (root / ".grid").exists()


def test_workspace_exactly_at_the_socket_limit_works(scratch: Path) -> None:
    root = _repo_with_socket_path_of(SOCKET_PATH_MAX, scratch)
    with running_daemon(root) as d:
        assert d.client().get("/health")["status"] == "ok"


def test_directory_outside_any_git_repository_is_refused(scratch: Path) -> None:
    result = run_gridd(scratch)
    assert result.returncode == 1
    assert f"not inside a git repository: {scratch}" in result.stderr
    assert not (scratch / ".grid").exists()


# -- graceful shutdown ------------------------------------------------------------------------


def _stop_by(how: str, d: DaemonProc) -> None:
    if how == "SIGTERM":
        d.proc.send_signal(signal.SIGTERM)
    elif how == "SIGINT":
        d.proc.send_signal(signal.SIGINT)
    else:
        with d.client() as c:
            assert c.post("/shutdown") == {"status": "shutting_down"}


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "POST /shutdown"])
def test_graceful_stop_with_open_streams_exits_zero_and_cleans_up(repo: Path, how: str) -> None:
    d = start_daemon(repo)
    try:
        reads: list[SSERead] = []
        errors: list[BaseException] = []

        def follow() -> None:
            try:
                reads.append(read_sse(d.sock, timeout=30))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=follow, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        client = d.client()
        wait_for(
            lambda: client.get("/state")["daemon"]["subscribers"] == 3,
            timeout=15,
            message="three SSE subscribers",
        )

        _stop_by(how, d)

        assert d.proc.wait(timeout=5) == 0
        for t in threads:
            t.join(timeout=5)
        assert not errors, errors
        assert len(reads) == 3
        for read in reads:
            assert read.ended
            assert read.types()[0] == "state.snapshot"
            assert read.types()[-1] == "daemon.stopping"
        assert not d.sock.exists()
        assert not (d.grid_dir / "gridd.pid").exists()
        assert "Traceback" not in d.stderr_text()
    finally:
        if d.proc.poll() is None:
            d.kill9()


def test_stopped_daemon_can_be_started_again_at_once(repo: Path) -> None:
    for _ in range(2):
        with running_daemon(repo) as d:
            pid = d.client().get("/health")["pid"]
        assert d.proc.returncode == 0
        assert pid == d.proc.pid


# -- refusing bad configuration and state -----------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("[events\nretain = 1\n", ["not valid TOML"]),
        ("[events]\nretian = 100\n", ["'events.retian'", "did you mean 'retain'?"]),
        ('[events]\nretain = "many"\n', ["'events.retain'", "valid integer"]),
        ("[events]\nretain = 3\n", ["'events.retain'", "greater than or equal to 100"]),
    ],
    ids=["bad-toml", "unknown-key", "wrong-type", "out-of-range"],
)
def test_invalid_config_stops_the_daemon_with_a_message_naming_the_key(
    repo: Path, config: str, expected: list[str]
) -> None:
    write_config(repo, config)

    result = run_gridd(repo)

    assert result.returncode == 1
    for text in expected:
        assert text in result.stderr
    assert "config.toml" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (repo / ".grid" / "gridd.sock").exists()
    assert not (repo / ".grid" / "gridd.pid").exists()


def test_corrupt_database_is_quarantined_and_reported_loudly(repo: Path) -> None:
    grid = repo / ".grid"
    grid.mkdir(mode=0o700)
    garbage = os.urandom(20_000)
    (grid / "gridd.db").write_bytes(garbage)

    with running_daemon(repo) as d:
        client = d.client()
        assert client.get("/health")["status"] == "degraded"
        warnings = client.get("/state")["daemon"]["warnings"]
        assert len(warnings) == 1
        assert "moved aside" in warnings[0]

        moved = sorted(grid.glob("gridd.db.corrupt-*"))
        assert len(moved) == 1
        assert moved[0].read_bytes() == garbage

        read = read_sse(
            d.sock, params={"since": "0"}, until=lambda r: "daemon.started" in r.types()
        )
        assert read.types() == ["daemon.store_quarantined", "daemon.started"]
        assert read.events[0].data["movedTo"] == [str(moved[0])]
        assert "STATE DATABASE UNREADABLE" in d.stderr_text()
        assert "STATE DATABASE UNREADABLE" in (repo / ".gridd-test-stderr").read_text()

    with running_daemon(repo) as d:  # the new database is fine: no second quarantine
        assert d.client().get("/health")["status"] == "ok"
        assert len(list(grid.glob("gridd.db.corrupt-*"))) == 1


def _database_at(path: Path, version: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for script in MIGRATIONS[:version]:
        conn.executescript(script)
    conn.execute(f"PRAGMA user_version = {version}")
    if version >= 1:
        conn.execute(
            "INSERT INTO events(type, data, ts) VALUES ('old.event', '{}', '2024-01-01T00:00:00Z')"
        )
    conn.close()


def test_database_from_an_older_gridd_is_migrated_and_kept(repo: Path) -> None:
    grid = repo / ".grid"
    grid.mkdir(mode=0o700)
    old = SCHEMA_VERSION - 1
    _database_at(grid / "gridd.db", old)

    with running_daemon(repo) as d:
        assert d.client().get("/health")["status"] == "ok"
        read = read_sse(
            d.sock, params={"since": "0"}, until=lambda r: "daemon.started" in r.types()
        )
        assert read.types() == (["old.event"] if old >= 1 else []) + ["daemon.started"]
        assert "migrated to schema version" in d.stderr_text()
    conn = sqlite3.connect(grid / "gridd.db")
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()
    assert not list(grid.glob("gridd.db.corrupt-*"))


def test_database_from_a_newer_gridd_is_refused_not_quarantined(repo: Path) -> None:
    grid = repo / ".grid"
    grid.mkdir(mode=0o700)
    _database_at(grid / "gridd.db", SCHEMA_VERSION)
    conn = sqlite3.connect(grid / "gridd.db")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()

    result = run_gridd(repo)

    assert result.returncode == 1
    assert f"schema version {SCHEMA_VERSION + 5}, newer than this gridd understands" in (
        result.stderr
    )
    assert not list(grid.glob("gridd.db.corrupt-*"))
    assert (grid / "gridd.db").exists()
    assert not (grid / "gridd.sock").exists()


def test_state_path_that_is_a_file_is_refused_with_a_message(repo: Path) -> None:
    (repo / ".grid").write_text("not a directory\n")
    result = run_gridd(repo)
    assert result.returncode == 1
    assert ".grid exists and is not a directory" in result.stderr
    assert "Traceback" not in result.stderr
    assert (repo / ".grid").read_text() == "not a directory\n"


@contextlib.contextmanager
def lock_held_by_another_process(
    ws: Workspace, *, writes: str = "", after: float = 0.0
) -> Iterator[subprocess.Popen[str]]:
    """A process holding ``flock`` on ``ws``'s lock that writes ``writes`` into it after
    ``after`` seconds ("{pid}" becomes its own pid), as a gridd winning the lock does."""
    program = textwrap.dedent(
        f"""
        import fcntl, os, time
        fd = os.open({str(ws.lock_path)!r}, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep({after!r})
        os.pwrite(fd, {writes!r}.format(pid=os.getpid()).encode(), 0)
        time.sleep(120)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_lock_loser_waits_briefly_for_the_winner_to_write_its_pid(tmp_path: Path) -> None:
    ws = Workspace(root=tmp_path)
    ws.ensure_grid_dir()
    # Won the lock, writes its pid a moment later.
    with (
        lock_held_by_another_process(ws, writes="{pid}\n", after=0.1) as holder,
        pytest.raises(AlreadyRunning) as info,
    ):
        daemon_module.acquire_lock(ws)
    assert info.value.pid == holder.pid
    assert f"gridd is already running for {tmp_path} (pid {holder.pid})" == info.value.message


def test_lock_held_by_a_process_that_wrote_no_pid_is_refused_naming_that_process(
    tmp_path: Path,
) -> None:
    ws = Workspace(root=tmp_path)
    ws.ensure_grid_dir()
    with lock_held_by_another_process(ws) as holder, pytest.raises(AlreadyRunning) as info:
        daemon_module.acquire_lock(ws)
    assert info.value.pid == holder.pid
    assert info.value.message.startswith(
        f"gridd cannot start for {tmp_path}: pid {holder.pid} ({sys.executable} -c "
    ), info.value.message
    assert ") holds .grid/gridd.lock. If that is not a gridd" in info.value.message
    assert f"end it (kill {holder.pid})" in info.value.message
    assert info.value.details["lockFilePid"] is None


def test_a_lock_file_naming_another_pid_is_refused_naming_the_real_holder(
    tmp_path: Path,
) -> None:
    ws = Workspace(root=tmp_path)
    ws.ensure_grid_dir()
    with lock_held_by_another_process(ws, writes="4242\n") as holder:
        wait_for(lambda: ws.lock_path.read_text() == "4242\n", message="the stale pid")
        with pytest.raises(AlreadyRunning) as info:
            daemon_module.acquire_lock(ws)
    assert info.value.pid == holder.pid
    assert f": pid {holder.pid} (" in info.value.message
    assert "; the lock file names pid 4242." in info.value.message


def test_where_the_kernel_cannot_name_the_holder_the_lock_file_pid_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lockholder, "PROC_LOCKS", tmp_path / "no-proc-locks")  # not Linux
    ws = Workspace(root=tmp_path)
    ws.ensure_grid_dir()
    with lock_held_by_another_process(ws, writes="4242\n"):
        wait_for(lambda: ws.lock_path.read_text() == "4242\n", message="the stale pid")
        with pytest.raises(AlreadyRunning) as info:
            daemon_module.acquire_lock(ws)
    assert info.value.message == f"gridd is already running for {tmp_path} (pid 4242)"
    ws.lock_path.write_text("")
    with lock_held_by_another_process(ws), pytest.raises(AlreadyRunning) as info:
        daemon_module.acquire_lock(ws)
    assert info.value.pid is None
    assert info.value.message == f"gridd is already running for {tmp_path} (pid unknown)"


def test_a_second_gridd_refused_by_a_flock_command_names_it(repo: Path) -> None:
    flock = shutil.which("flock")
    if flock is None:
        pytest.skip("flock (util-linux) is not installed")
    lock = repo / ".grid" / "gridd.lock"
    lock.parent.mkdir(mode=0o700)
    lock.touch(mode=0o600)
    holder = subprocess.Popen([flock, str(lock), "sleep", "60"])
    try:
        wait_for(lambda: lockholder.flock_holder(lock) == holder.pid, message="flock to hold it")
        result = run_gridd(repo)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert (
        f"gridd: gridd cannot start for {repo.resolve()}: pid {holder.pid}"
        f" ({flock} {lock} sleep 60) holds .grid/gridd.lock." in result.stderr
    ), result.stderr
