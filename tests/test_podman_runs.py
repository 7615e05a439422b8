"""The podman executor, end to end: real containers (an image built from Debian packages with
mmdebstrap, cached), the real in-box shim, real ``gridd`` processes and the test agents.

Needs podman, runc and mmdebstrap (``make test`` installs them as root:
contrib/podman/setup.sh); skipped, with the reason, without them."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.client import GridClient
from gridd.errors import Conflict
from gridd.runs.image import default_cache_dir, ensure_image
from gridd.runs.podman import PodmanEngine
from gridd.settings import PodmanSettings
from tests.support.api import wait_task_status
from tests.support.daemons import Restartable, core_daemon
from tests.support.git import git_show
from tests.support.repos import AGENTS_DIR, write_config
from tests.support.waits import wait_for

MISSING = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
pytestmark = [pytest.mark.xdist_group("podman")]
pytestmark.append(
    pytest.mark.skipif(
        bool(MISSING) or os.geteuid() != 0,
        reason=f"needs root and podman, runc, mmdebstrap (missing: {', '.join(MISSING) or 'root'});"
        " as root: apt-get install -y podman runc mmdebstrap",
    )
)


def start(c: GridClient, task: dict[str, object]) -> None:
    c.post("/tasks", task)
    c.post("/session/start", {"featureBranch": "feature/boxed"})


@pytest.fixture(scope="module")
def image() -> str:
    """The Debian box image: built once per machine (minutes), then found by its hash."""
    return ensure_image(
        ["podman"],
        suite="bookworm",
        packages=["git", "python3"],
        cache_dir=default_cache_dir(),
    )


def podman_config(
    root: Path,
    image: str,
    profiles: dict[str, list[str]],
    mounts: list[str],
    *,
    extra: tuple[str, ...] = (),
) -> None:
    lines = [
        "[scheduler]",
        f'default_agent = "{next(iter(profiles))}"',
        "tick_seconds = 0.2",
        "max_attempts = 1",
        "[executors]",
        'default = "podman"',
        "[executors.podman]",
        f'image = "{image}"',
        f"mounts = {json.dumps([f'{AGENTS_DIR}:{AGENTS_DIR}:ro', *mounts])}",
        "look_seconds = 0.1",
        *extra,
    ]
    for name, argv in profiles.items():
        lines += [f"[agents.{name}]", f"command = {json.dumps(argv)}"]
    write_config(root, "\n".join(lines) + "\n")


def containers(task: str) -> list[dict[str, object]]:
    out = subprocess.run(
        ["podman", "ps", "--all", f"--filter=label=grid.task={task}", "--format=json"],
        capture_output=True,
        check=True,
    ).stdout
    return list(json.loads(out or b"[]"))


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    tasks: list[str] = []
    yield tasks
    for task in tasks:
        for row in containers(task):
            names = row.get("Names") or []
            subprocess.run(["podman", "rm", "-f", "-t", "0", *names], capture_output=True)  # type: ignore[list-item]


def test_a_podman_run_takes_answers_and_its_branch_is_merged_back(
    repo: Path, image: str, cleanup: list[str]
) -> None:
    cleanup.append("boxed")
    podman_config(repo, image, {"reader": ["python3", str(AGENTS_DIR / "read_line.py")]}, [])
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "boxed", "title": "read a line in a container"})
        agent = wait_for(
            lambda: next(
                (a for a in c.get("/agents") if a["lastOutput"] == "ready for a line"), None
            ),
            timeout=60,
            message="the containerised agent's first line",
        )
        [box] = containers("boxed")  # one container, labelled with the task and workspace
        labels = box["Labels"]
        assert isinstance(labels, dict) and labels["grid.run"] == agent["id"]
        shown = c.get(f"/agents/{agent['id']}")
        # Where it runs: the container (the box) on this machine.
        where = {"kind": "podman", "box": box["Names"][0], "node": socket.gethostname()}  # type: ignore[index]
        assert shown["executor"] == where
        c.post(f"/agents/{agent['id']}/respond", {"response": "from the host"})
        wait_task_status(c, "boxed", "review", timeout=60)
        assert git_show(repo, "grid/boxed:answer.txt") == "from the host\n"
        c.post("/tasks/boxed/approve")
        wait_task_status(c, "boxed", "done", timeout=60)
        assert git_show(repo, "feature/boxed:answer.txt") == "from the host\n"  # merged
        run_dir = Path(agent["runDir"])
        assert (run_dir / "output.log").read_text() == "ready for a line\ngot a line\n"
        wait_for(lambda: containers("boxed") == [], timeout=30, message="the container removed")


def test_a_killed_daemon_reattaches_to_its_container_by_label_with_contiguous_output(
    repo: Path, image: str, cleanup: list[str], tmp_path: Path
) -> None:
    cleanup.append("burst")
    control = tmp_path / "control"
    control.mkdir()
    argv = ["python3", str(AGENTS_DIR / "lines.py"), str(control), "300"]
    podman_config(repo, image, {"lines": argv}, [f"{control}:{control}"])
    daemon = Restartable(repo)
    try:
        daemon.start()
        c = daemon.client()
        start(c, {"id": "burst", "title": "many lines"})
        agent = wait_for(
            lambda: next((a for a in c.get("/agents") if a["lastOutput"] == "burst ready"), None),
            timeout=60,
            message="the agent ready",
        )
        daemon.kill9()
        # The container goes on without a daemon: everything below is written meanwhile.
        (control / "go").touch()
        wait_for(lambda: (control / "burst.done").exists(), timeout=30, message="the burst")
        (control / "end").touch()
        daemon.start()
        wait_task_status(c, "burst", "review", timeout=60)
        [again] = c.get("/agents", params={"all": "1"})
        assert again["id"] == agent["id"]  # reattached: the same run, never a second
        lines = (Path(agent["runDir"]) / "output.log").read_text().splitlines()
        assert lines == ["burst ready"] + [f"burst line {n}" for n in range(1, 301)]
    finally:
        daemon.close()


def test_a_cancelled_podman_run_stops_and_its_container_goes(
    repo: Path, image: str, cleanup: list[str], tmp_path: Path
) -> None:
    cleanup.append("stuck")
    pids = tmp_path / "pids"
    pids.mkdir()
    argv = ["python3", str(AGENTS_DIR / "hang.py"), str(pids)]
    podman_config(repo, image, {"hang": argv}, [f"{pids}:{pids}"])
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "stuck", "title": "never ends"})
        wait_for(lambda: (pids / "stuck.pids").exists(), timeout=60, message="the hang agent")
        c.request("DELETE", "/tasks/stuck")
        wait_for(lambda: not c.get("/agents"), timeout=60, message="the agent stopped")
        wait_for(lambda: containers("stuck") == [], timeout=30, message="the container removed")
        # Whether the agent handles SIGTERM was asked in the box: hang.py does not (only
        # its child does), so the stop is not noted as one it could have answered. Read on
        # this machine, the box's pid is some other process's (a kernel thread's, here).
        [agent] = c.get("/agents", params={"all": "1"})
        assert agent["signalledAt"] is None


OFFLINE = """
import socket
try:
    socket.create_connection(("1.1.1.1", 53), 2)
    print("online")
except OSError as exc:
    print("offline:", exc)
"""


def test_a_podman_run_has_no_network_unless_given_one(
    repo: Path, image: str, cleanup: list[str]
) -> None:
    cleanup.append("offline")
    podman_config(repo, image, {"net": ["python3", "-c", OFFLINE]}, [])
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "offline", "title": "try the network"})
        wait_task_status(c, "offline", "review", timeout=60)
        [agent] = c.get("/agents", params={"all": "1"})
        assert agent["lastOutput"].startswith("offline:"), agent["lastOutput"]


def test_a_podman_run_past_its_memory_limit_is_killed_and_fails(
    repo: Path, image: str, cleanup: list[str]
) -> None:
    cleanup.append("greedy")
    greedy = ["python3", "-c", "x = bytearray(400 * 1024 * 1024); print('allocated')"]
    podman_config(repo, image, {"greedy": greedy}, [], extra=('memory = "64m"',))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "greedy", "title": "allocate too much"})
        wait_task_status(c, "greedy", "failed", timeout=60)
        [agent] = c.get("/agents", params={"all": "1"})
        assert agent["exitCode"] == 128 + 9  # killed by the kernel at the limit, never a success
        assert agent["exitReason"] == "oom_killed"  # said so, not a bare SIGKILL
        assert "out of memory" in agent["error"]
        log = Path(agent["runDir"], "output.log")
        assert not log.exists() or "allocated" not in log.read_text()


def test_a_containers_inputs_are_staged_private_mounted_read_only_and_go_with_it(
    image: str, tmp_path: Path
) -> None:
    engine = PodmanEngine(
        PodmanSettings(image=image), cache_dir=tmp_path / "cache", stage_dir=tmp_path / "boxes"
    )
    name = f"gridd-test-stage-{os.getpid()}"
    spec = {"argv": ["sleep", "60"], "env": {"API_KEY": "secret"}, "branch": "main", "base": ""}
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    who = ["-c", "user.name=t", "-c", "user.email=t@x"]
    subprocess.run(
        ["git", "-C", str(repo), *who, "commit", "-q", "--allow-empty", "-m", "x"], check=True
    )
    bundle = subprocess.run(
        ["git", "-C", str(repo), "bundle", "create", "-q", "-", "main"],
        capture_output=True,
        check=True,
    ).stdout
    files = {"spec.json": json.dumps(spec).encode(), "base.bundle": bundle}
    try:
        engine.create(name, labels={"grid.test": "stage"}, files=files)
        stage = tmp_path / "boxes" / name
        assert stat.S_IMODE(stage.stat().st_mode) == 0o700
        for file in ("spec.json", "base.bundle", "boxshim.py"):
            assert stat.S_IMODE((stage / file).stat().st_mode) == 0o600, file
        with pytest.raises(Conflict):  # the name is the claim, and its inputs stay
            engine.create(name, labels={}, files=files)
        assert json.loads((stage / "spec.json").read_text()) == spec
        # The shim says on its stdout that the agent runs: read from the log, no exec.
        news = wait_for(lambda: engine.news(name), timeout=30, message="the shim's news")
        assert isinstance(news["agent"]["pid"], int), news
        inside = subprocess.run(
            ["podman", "exec", name, "sh", "-c", "stat -c %a /grid/in/spec.json; touch /grid/in/x"],
            capture_output=True,
            text=True,
        )
        assert inside.stdout.split() == ["600"] and inside.returncode != 0  # read-only
    finally:
        engine.remove(name)
    assert not (tmp_path / "boxes" / name).exists()
    assert not (tmp_path / "boxes" / f"{name}.log").exists()
    assert engine.info(name) is None
